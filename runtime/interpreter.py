"""Runs a host program: a short loop over statements and a dispatch table keyed by type.

    >>> from runtime.interpreter import Interpreter
    >>> from runtime.device import make_backend
    >>> from runtime.comm import make_communicator
    >>> run = Interpreter(program, make_backend("cpu"), make_communicator("mpi"))  # doctest: +SKIP
    >>> (out,) = run(a_shard, b)                                                   # doctest: +SKIP

Values live in an environment keyed by name. The host never blocks inside a program:
streams are ordered by events only, and collectives are posted and waited on streams.
Every value stays referenced until the program returns, and a verified program has joined
every worker stream into the user's stream by then, so the caching allocator cannot hand
out memory that a worker stream still uses. Errors name the statement being executed.

Communication, Wait and Synchronize statements are also written to the process's flight
recorder (``runtime.flight``) as they run, so a hang can be traced to the rank and
statement where it started.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from hostir import ir
from hostir.errors import ExecutionError, HostIrError, InputMismatchError
from hostir.options import options
from hostir.printer import format_statement
from hostir.verify import verify
from runtime import fault_injection, flight
from runtime.comm.base import check_team
from runtime.device import DTYPE_NAMES, DTYPES
from runtime.kernels import MatmulChoice, launcher, matmul_epilogue, matmul_shapes


class _Frame:
    """The interpreter's state while one program runs."""

    __slots__ = ("env", "current", "user", "posted")

    def __init__(self, env, current):
        self.env = env
        self.current = current
        self.user = current
        self.posted: dict = {}  # communication handle -> (its flight entry, the entry's n)


def transposable_inputs(program: ir.Program) -> frozenset:
    """Names of the inputs that the program reads only as the ``b`` operand of
    epilogue-free ``Matmul`` statements, directly or through Selects of their leading
    axes. Their memory may be the transpose of a contiguous tensor in the last two axes
    (``w.t()``, strides ``(1, rows)``; leading axes of extent 1 as ``view`` adds them):
    cuBLAS and the generated kernel (layout TN) read B that way in place, so a caller
    that holds ``W`` and needs ``W^T`` makes no transposed copy (the layers' backward
    passes)."""
    ok: dict[str, bool] = {}  # tensor name -> every use so far is a transposable one
    selected: dict[str, str] = {}  # select output -> the tensor it selects from
    for s in ir.walk(program.body):
        if isinstance(s, ir.ForLoop):
            continue  # its body is walked; it reads no tensor itself
        for f in dataclasses.fields(s):
            v = getattr(s, f.name)
            for x in v if isinstance(v, (tuple, list)) else (v,):
                if not isinstance(x, ir.Tensor) or (isinstance(s, ir.Select) and f.name == "out"):
                    continue
                good = ((isinstance(s, ir.Matmul) and f.name == "b" and s.epilogue is None)
                        or (isinstance(s, ir.Select) and f.name == "input"
                            and s.axis < len(x.local_shape) - 2))
                ok[x.name] = ok.get(x.name, True) and good
        if isinstance(s, ir.Select):
            selected[s.out.name] = s.input.name
    # A select's output that is used otherwise spoils what it was selected from.
    changed = True
    while changed:
        changed = False
        for out, src in selected.items():
            if not ok.get(out, True) and ok.get(src, False):
                ok[src] = False
                changed = True
    outputs = {t.name for t in program.outputs}
    return frozenset(t.name for t in program.inputs if len(t.local_shape) >= 2
                     and ok.get(t.name) and t.name not in outputs)


def _transposed(x: torch.Tensor) -> bool:
    """``x`` is the transpose of a contiguous tensor in its last two axes."""
    return x.dim() >= 2 and x.transpose(-2, -1).is_contiguous()


def check_inputs(program: ir.Program, args, device: torch.device,
                 transposable: frozenset = frozenset()) -> None:
    """Refuse inputs that do not match the program's signature, before any collective.
    Inputs must be contiguous, except those in ``transposable`` (see
    ``transposable_inputs``), which may also be a transposed view."""
    if len(args) != len(program.inputs):
        raise InputMismatchError(
            f"expected {len(program.inputs)} inputs "
            f"({', '.join(t.name for t in program.inputs)}), got {len(args)}"
        )
    for t, x in zip(program.inputs, args):
        if not isinstance(x, torch.Tensor):
            raise InputMismatchError(f"input {t.name}: expected a torch.Tensor, got {type(x).__name__}")
        got = tuple(x.shape)
        if len(got) != len(t.local_shape):
            raise InputMismatchError(
                f"input {t.name}: expected rank {len(t.local_shape)} (local shape "
                f"{list(t.local_shape)}), got rank {len(got)} {list(got)}"
            )
        for axis, (want, have) in enumerate(zip(t.local_shape, got)):
            if want != have:
                kind = t.parallel[axis].value
                note = " (a DIDx axis holds this rank's slice: extent 1)" if kind == "DIDx" else ""
                raise InputMismatchError(
                    f"input {t.name} axis {axis} ({kind}): expected extent {want}{note}, got {have}"
                )
        if DTYPE_NAMES.get(x.dtype) != t.dtype:
            raise InputMismatchError(f"input {t.name}: expected dtype {t.dtype}, got {x.dtype}")
        if x.device.type != device.type or (device.index is not None and x.device.index != device.index):
            raise InputMismatchError(f"input {t.name}: expected device {device}, got {x.device}")
        if not x.is_contiguous() and not (t.name in transposable and _transposed(x)):
            also = " or a transposed view (w.t())" if t.name in transposable else ""
            raise InputMismatchError(f"input {t.name}: expected a contiguous tensor{also}, "
                                     f"got strides {x.stride()}")


def describe_inputs(args) -> str:
    """A short fingerprint of the inputs: shape and dtype of each, e.g.
    ``float32[2, 1, 16, 32], float32[32, 16]``."""
    return ", ".join(
        f"{str(x.dtype).removeprefix('torch.')}{list(x.shape)}" if isinstance(x, torch.Tensor)
        else type(x).__name__ for x in args)


def agree_on_inputs(program: ir.Program, args, device: torch.device, comm,
                    transposable: frozenset = frozenset()) -> None:
    """``check_inputs`` on every rank, then one small collective so that every rank learns
    every other rank's verdict and input shapes: a rank that passed bad or different
    inputs makes *every* rank raise ``InputMismatchError`` naming it, instead of leaving
    the others waiting in a collective it never posts."""
    try:
        check_inputs(program, args, device, transposable)
        local = None
    except InputMismatchError as e:
        local = str(e)
    verdicts = comm.agree((local, describe_inputs(args)))
    refused = {r: err for r, (err, _) in enumerate(verdicts) if err is not None}
    shapes = [fp for _, fp in verdicts]
    if refused:
        messages = set(refused.values())
        if len(refused) == len(verdicts) and len(messages) == 1:
            text = f"{messages.pop()} (on every rank)"
        else:
            text = "; ".join(f"rank {r} refused its inputs: {m}" for r, m in refused.items())
    elif len(set(shapes)) > 1:
        text = ("inputs differ between ranks: expected every rank to pass the same shapes and "
                "dtypes, found " + "; ".join(f"rank {r} passed {fp}" for r, fp in enumerate(shapes)))
    else:
        return
    err = InputMismatchError(f"rank {comm.rank}: {text}")
    err.on_every_rank = True  # every rank raises it: nobody is left waiting
    raise err


class Interpreter:
    """A verified program bound to a device backend and a communicator; call it with the
    program's inputs (local shards), get its outputs."""

    def __init__(self, program: ir.Program, backend, communicator=None, kernels=None,
                 matmul: str = "cublas", flat: bool = True):
        """``kernels``: launch functions by kernel name, overriding the program's own
        ``KernelDef``s (compiled on first use, or in ``prepare``). ``matmul``: what runs
        ``Matmul`` statements: ``cublas``, ``codegen`` (the generated split-K kernel) or
        ``auto`` (the faster of the two per shape, measured in ``prepare``). ``flat``:
        run the program as the flat list of steps that ``_flatten`` builds once (loops
        unrolled, indices and worker streams resolved); False walks the statements each
        call (the reference path, and the one fault injection instruments)."""
        verify(program)
        self.flat = flat
        self._steps = None  # (steps, their statements), built on the first flat call
        self.program = program
        self.backend = backend
        self.comm = communicator
        self.kernels = dict(kernels or {})
        self.kernel_defs = {k.name: k for k in program.kernels}
        self.matmul = MatmulChoice(matmul, program, backend.name)
        self.params = {
            "numberOfStreams": program.number_of_streams,
            "rank": communicator.rank if communicator is not None else 0,
            "worldSize": communicator.world_size if communicator is not None else 1,
        }
        for s in ir.walk(program.body):
            if isinstance(s, ir.Communication):
                if communicator is None:
                    raise ExecutionError(f"{format_statement(s)}: the program communicates but no communicator was given")
                check_team(communicator, s.team)
        # Index expressions compiled once (by id: they live as long as the program), and
        # the input signature, so that a call does not walk or recompute either.
        self._compiled: dict[int, object] = {}
        self._transposable = transposable_inputs(program)
        self._signature = [(t.local_shape, DTYPES[t.dtype], t.name in self._transposable)
                           for t in program.inputs]
        self._input_names = [t.name for t in program.inputs]
        self._output_names = [t.name for t in program.outputs]
        self._direct = self._direct_sendrecv_roots(communicator)
        # root name -> (tensor, handle, {(peer, offset): peer's view}), kept across calls
        self._symmetric: dict[str, tuple] = {}
        # The first call checks that every rank passes the same inputs (off with
        # HOSTIR_DISABLE=input_agreement, and needless on one rank).
        self._agreed = (communicator is None or communicator.world_size == 1
                        or not hasattr(communicator, "agree")
                        or options().disable("input_agreement"))
        self._flight_setup(program, communicator)
        fault = fault_injection.from_environ()
        if fault is not None:  # tests only: the plain statement loop otherwise
            fault_injection.instrument(self, fault)

    def _flight_setup(self, program: ir.Program, communicator) -> None:
        """Number the statements the flight recorder records (walk order, the same on
        every rank) and note the loop indices around each."""
        self.flight = flight.recorder()
        self._recorded: dict[int, tuple] = {}  # id(statement) -> its flight.statement_meta
        if not self.flight.enabled:
            return
        if communicator is not None:
            self.flight.bind(communicator.rank, communicator.world_size)
        pid = self.flight.add_program(program.provenance or "program")
        comm = getattr(communicator, "name", "")

        def walk(body, loops):
            for s in body:
                if isinstance(s, (ir.Communication, ir.Wait, ir.Synchronize)):
                    kind = (s.type.name if isinstance(s, ir.Communication)
                            else type(s).__name__)
                    self._recorded[id(s)] = flight.statement_meta(
                        pid, len(self._recorded), format_statement(s), loops, kind,
                        "" if isinstance(s, ir.Synchronize) else comm)
                elif isinstance(s, ir.ForLoop):
                    walk(s.body, loops + (s.index.name,))

        walk(program.body, ())

    def flight_of(self, s, env: dict) -> tuple:
        """(``s``'s flight-recorder meta, the values of its loop indices in ``env``), or
        (None, ()) for a statement the recorder does not record (or when it is off)."""
        meta = self._recorded.get(id(s))
        return (None, ()) if meta is None else (meta, tuple([env[n] for n in meta[3]]))

    def _direct_sendrecv_roots(self, communicator) -> dict[str, str]:
        """SendRecv outputs whose buffer the sender can write directly: {output: root}.

        With a transport that offers symmetric tensors (the copy engine), a SendRecv whose
        output is a view (a chain of Selects) of a program-allocated tensor that is not a
        program output gets that tensor allocated once in symmetric memory, at the same
        place on every rank. The program is the same on every rank (SPMD), so the peer's
        receive buffer is this rank's output expression evaluated with ``rank`` bound to
        the peer: the sender writes there over the peer mapping and the receiver reads
        its data in place, with no staging buffer and no local copy. Off with
        HOSTIR_DISABLE=direct_sendrecv."""
        if getattr(communicator, "symmetric_tensor", None) is None or \
                options().disable("direct_sendrecv"):
            return {}
        self._defining_select = {s.out.name: s for s in ir.walk(self.program.body)
                                 if isinstance(s, ir.Select)}
        allocated = {s.out.name for s in ir.walk(self.program.body) if isinstance(s, ir.Allocate)}
        outputs = {t.name for t in self.program.outputs}
        roots = {}
        for s in ir.walk(self.program.body):
            if isinstance(s, ir.Communication) and s.type is ir.CommunicationType.SendRecv:
                root = s.output.name
                while root in self._defining_select:
                    root = self._defining_select[root].input.name
                if root in allocated and root not in outputs:
                    roots[s.output.name] = root
        return roots

    def index(self, e: ir.IndexExpr, env: dict) -> int:
        """``ir.evaluate(e, env)``, through ``e``'s compiled form."""
        fn = self._compiled.get(id(e))
        if fn is None:
            fn = self._compiled[id(e)] = ir.compile_index(e)
        return fn(env)

    def _inputs_match(self, args) -> bool:
        """The common case of ``check_inputs``, fast: every input has the program's local
        shape and dtype, is contiguous (or a transposed view where allowed) and on this
        device (else ``check_inputs`` says what is wrong)."""
        if len(args) != len(self._signature):
            return False
        device = self.backend.device
        for (shape, dtype, transposable), x in zip(self._signature, args):
            if not (isinstance(x, torch.Tensor) and x.dtype is dtype and x.shape == shape
                    and (x.is_contiguous() or (transposable and _transposed(x)))):
                return False
            where = x.device
            if where.type != device.type or (device.index is not None and where.index != device.index):
                return False
        return True

    def peer_view(self, name: str, root: torch.Tensor, env: dict, peer: int) -> torch.Tensor:
        """Tensor ``name`` as rank ``peer`` sees it, as a view of this rank's ``root``:
        the Selects that define it, evaluated with ``rank`` bound to ``peer``."""
        chain = []
        while name in self._defining_select:
            chain.append(self._defining_select[name])
            name = chain[-1].input.name
        env = {**env, "rank": peer}
        view = root
        for s in reversed(chain):
            view = view.select(s.axis, self.index(s.index, env))
        return view

    def prepare(self, *args: torch.Tensor) -> None:
        """Do every lazy set-up now, not inside the first timed call: the ranks agree on
        the inputs, worker streams and their events are created, NCCL connects its peers,
        cuBLAS creates its handles and workspaces, transports reserve their buffers. It
        runs the program once on ``args`` and waits for the device. Generated kernels
        are compiled (or found in the kernel cache) and loaded; with ``matmul="auto"``
        cuBLAS and the generated matmul are timed on each Matmul shape."""
        for name in self.kernel_defs:
            self.kernel(name)
        reserve = getattr(self.comm, "reserve", None)
        if reserve is not None:  # a transport's buffers: set up (a host collective) now
            nbytes = [math.prod(s.input.local_shape) * DTYPES[s.input.dtype].itemsize
                      for s in ir.walk(self.program.body)
                      if isinstance(s, ir.Communication)
                      and s.type is ir.CommunicationType.SendRecv
                      and s.output.name not in self._direct]  # those need no staging
            if nbytes:
                reserve(max(nbytes))
        if self.backend.name == "cuda" and args:
            self.matmul.measure(matmul_shapes(self.program), args[0].dtype, self.backend.device)
        self(*args)
        self.backend.synchronize()

    def kernel(self, name: str):
        """The launch function of kernel ``name`` (compiled and loaded on first use)."""
        launch = self.kernels.get(name)
        if launch is None:
            defn = self.kernel_defs.get(name)
            if defn is None:
                raise ExecutionError(f"kernel {name!r} is not registered with this "
                                     f"interpreter nor defined by the program")
            launch = self.kernels[name] = launcher(defn, self.backend.device)
        return launch

    def __call__(self, *args: torch.Tensor) -> list[torch.Tensor]:
        if self._agreed:
            if not self._inputs_match(args):
                check_inputs(self.program, args, self.backend.device, self._transposable)
        else:
            agree_on_inputs(self.program, args, self.backend.device, self.comm,
                            self._transposable)
            self._agreed = True
        env = dict(self.params)
        env.update(zip(self._input_names, args))
        frame = _Frame(env, self.backend.current_stream())
        try:
            if self.flat and "_body" not in self.__dict__:  # not instrumented
                self._run_flat(frame)
            else:
                self._body(self.program.body, frame)
        except BaseException:
            # A program that failed half-way never reached its joins: order the user's
            # stream after every worker (and the communicator's stream) before the
            # environment's tensors go back to the allocator on the user's stream.
            comm_stream = getattr(self.comm, "stream", None)
            self.backend.join_all(frame.user, [comm_stream] if comm_stream is not None else [])
            raise
        finally:
            # Also after an error: the caller gets its own stream back.
            self.backend.set_current_stream(frame.user)
        return [env[name] for name in self._output_names]

    def _body(self, body, frame: _Frame) -> None:
        for s in body:
            try:
                _RULES[type(s)](self, s, frame)
            except Exception as e:  # noqa: BLE001 - re-raised with the statement named
                err = self._where(e, s)
                if err is e:
                    raise
                raise err from e

    def _where(self, e: Exception, s) -> Exception:
        """``e`` raised while executing ``s``, as the error to raise: it names ``s``."""
        if isinstance(e, HostIrError):
            return e if getattr(e, "_hostir_where", False) else _annotate(e, s, self.params["rank"])
        err = ExecutionError(
            f"rank {self.params['rank']}: while executing `{format_statement(s)}`: "
            f"{type(e).__name__}: {e}"
        )
        err._hostir_where = True
        return err

    def _run_flat(self, frame: _Frame) -> None:
        if self._steps is None:
            self._steps = self._flatten()
        steps, statements = self._steps
        i = 0
        try:
            for i, step in enumerate(steps):
                step(frame)
        except Exception as e:  # noqa: BLE001 - re-raised with the statement named
            err = self._where(e, statements[i])
            if err is e:
                raise
            raise err from e

    def _flatten(self) -> tuple[list, list]:
        """The program as one list of steps, each a closure over one statement with what
        the statement-walking path re-derives every call done once: loops unrolled (the
        bounds are constants), index expressions evaluated (they depend only on loop
        indices and the rank, world size and stream count, fixed for this interpreter),
        worker streams, collective peers and flight-recorder entries' loop values
        resolved. A Select of a tensor that is the same every call (a symmetric
        allocation, or a Select of one) is made on the first call and reused."""
        steps, statements = [], []
        fixed: dict[str, list] = {}  # see _step

        def emit(body, bound: dict):
            for s in body:
                if isinstance(s, ir.ForLoop):
                    for i in range(s.start, s.stop):
                        emit(s.body, {**bound, s.index.name: i})
                    continue
                statements.append(s)
                steps.append(self._step(s, {**self.params, **bound}, fixed))

        emit(self.program.body, {})
        return steps, statements

    def _step(self, s, env: dict, fixed: dict):
        """One statement of ``_flatten`` as a step; ``env``: the loop indices around it and
        the interpreter's parameters; ``fixed``: the names whose value is the same every
        call at this point of the program, each with a cell that holds its value once
        made (Selects and Allocates rebind names: updated here in program order)."""
        it = self
        if isinstance(s, (ir.Select, ir.Allocate)):
            fixed.pop(s.out.name, None)
        if isinstance(s, ir.Select):
            out, src, axis, at = s.out.name, s.input.name, s.axis, self.index(s.index, env)
            if src in fixed:
                cell = fixed[out] = []
                source = fixed[src]

                def select_fixed(f):
                    if not cell:
                        cell.append(source[0].select(axis, at))
                    f.env[out] = cell[0]
                return select_fixed

            if axis == 0:  # indexing takes torch's shorter path to the same select

                def select_first(f):
                    f.env[out] = f.env[src][at]
                return select_first

            def select(f):
                f.env[out] = f.env[src].select(axis, at)
            return select
        if isinstance(s, ir.SetCurrentStream):
            set_stream = self.backend.set_current_stream
            if isinstance(s.stream, ir.PoolStream):
                stream = self.backend.worker(self.index(s.stream.index, env),
                                             self.program.number_of_streams)

                def set_current(f):
                    f.current = stream
                    set_stream(stream)
                return set_current
            name = s.stream.name

            def set_named(f):
                f.current = f.env[name]
                set_stream(f.current)
            return set_named
        if isinstance(s, ir.Synchronize):
            meta, loops = self.flight_of(s, env)
            if isinstance(s.stream, ir.PoolStream):
                waited = self.backend.worker(self.index(s.stream.index, env),
                                             self.program.number_of_streams)
                return lambda f: _sync(it, f, waited, meta, loops)
            name = s.stream.name
            return lambda f: _sync(it, f, f.env[name], meta, loops)
        if isinstance(s, ir.Allocate):
            out, shape, dtype = s.out.name, s.out.local_shape, s.out.dtype
            if out in self._direct.values():
                cell = fixed[out] = []

                def allocate_symmetric(f):
                    _allocate(it, s, f)
                    cell[:] = [f.env[out]]
                return allocate_symmetric
            allocate = self.backend.allocate

            def alloc(f):
                f.env[out] = allocate(shape, dtype)
            return alloc
        if isinstance(s, ir.Communication):
            post, (meta, loops) = _poster(self, s, env), self.flight_of(s, env)
            return lambda f: _communicate(it, s, f, post, meta, loops)
        if isinstance(s, ir.Wait):
            meta, loops = self.flight_of(s, env)
            return lambda f: _await(it, s, f, meta, loops)
        rule = _RULES[type(s)]  # the other rules read no loop index
        return lambda f: rule(it, s, f)

    def stream(self, ref: ir.StreamRef, frame: _Frame):
        if isinstance(ref, ir.StreamValue):
            return frame.env[ref.name]
        index = self.index(ref.index, frame.env)
        return self.backend.worker(index, self.program.number_of_streams)


def _annotate(e: HostIrError, s, rank: int) -> HostIrError:
    err = type(e)(*e.args) if not hasattr(e, "line") else e
    if err is not e:
        err.args = (f"rank {rank}: while executing `{format_statement(s)}`: {e}",)
    err._hostir_where = True
    err.__cause__ = e
    return err


# --------------------------------------------------------------------------- rules


def _get_current_stream(it: Interpreter, s: ir.GetCurrentStream, f: _Frame) -> None:
    f.env[s.stream.name] = f.current


def _set_current_stream(it: Interpreter, s: ir.SetCurrentStream, f: _Frame) -> None:
    f.current = it.stream(s.stream, f)
    it.backend.set_current_stream(f.current)


def _synchronize(it: Interpreter, s: ir.Synchronize, f: _Frame) -> None:
    _sync(it, f, it.stream(s.stream, f), *it.flight_of(s, f.env))


def _sync(it: Interpreter, f: _Frame, waited, meta, loops: tuple) -> None:
    """The current stream waits for ``waited``; recorded (``meta``: see ``flight_of``)."""
    it.backend.wait_stream(f.current, waited)
    if meta is not None:  # CUDA: an event wait, issued (the collectives carry events)
        it.flight.start(meta, loops, 0, 0, f.current, completed=True)


def _allocate(it: Interpreter, s: ir.Allocate, f: _Frame) -> None:
    if s.out.name in it._direct.values():
        # Allocated once (a host collective: every rank runs the same program, in the same
        # order) and reused by every call: the peers write into it directly. Reuse is safe
        # because a peer writes only after the SendRecv's first barrier, which this rank
        # reaches only after its previous call's GEMMs (the workers wait on the user's
        # stream, which joined them).
        entry = it._symmetric.get(s.out.name)
        if entry is None:
            entry = it._symmetric[s.out.name] = (*it.comm.symmetric_tensor(
                s.out.local_shape, DTYPES[s.out.dtype]), {})  # + the peers' views made
        f.env[s.out.name] = entry[0]
        return
    f.env[s.out.name] = it.backend.allocate(s.out.local_shape, s.out.dtype)


def _select(it: Interpreter, s: ir.Select, f: _Frame) -> None:
    f.env[s.out.name] = f.env[s.input.name].select(s.axis, it.index(s.index, f.env))


def _communication(it: Interpreter, s: ir.Communication, f: _Frame) -> None:
    _communicate(it, s, f, _poster(it, s, f.env), *it.flight_of(s, f.env))


def _poster(it: Interpreter, s: ir.Communication, env: dict):
    """What posts ``s``'s collective: ``post(out, inp, stream) -> work``. ``env`` binds the
    loop indices and the rank, which SendRecv's peers and slots depend on."""
    c, t, T = it.comm, s.type, ir.CommunicationType
    if t is T.Allgather:
        return c.allgather
    if t is T.ReduceScatter:
        return lambda out, inp, stream: c.reduce_scatter(out, inp, s.reduce_op, stream)
    if t is T.Allreduce:
        return lambda out, inp, stream: c.allreduce(out, inp, s.reduce_op, stream)
    if t is T.Broadcast:
        return lambda out, inp, stream: c.broadcast(out, inp, s.root, stream)
    send_peer = it.index(s.send_peer, env) % c.world_size
    recv_peer = it.index(s.recv_peer, env) % c.world_size
    root = it._direct.get(s.output.name)
    if root is None:
        return lambda out, inp, stream: c.sendrecv(out, inp, send_peer, recv_peer, stream)

    def direct(out, inp, stream):
        tensor, handle, views = it._symmetric[root]
        # The peer's slot, found once per (statement, local slot, peer): the local slot
        # stands for the loop indices it was selected with (each iteration of the
        # lowered rings receives into its own slot, so the map is one to one).
        key = (id(s), out.data_ptr(), send_peer)
        dst = views.get(key)
        if dst is None:
            offset = it.peer_view(s.output.name, tensor, env, send_peer).storage_offset()
            dst = views[key] = c.remote_view(handle, send_peer, inp.shape, inp.dtype, offset)
        return c.sendrecv_direct(out, inp, send_peer, recv_peer, stream, handle, dst)
    return direct


def _communicate(it: Interpreter, s: ir.Communication, f: _Frame, post, meta,
                 loops: tuple) -> None:
    """Post ``s``'s collective through ``post`` (``_poster``); recorded (``meta``)."""
    inp, out = f.env[s.input.name], f.env[s.output.name]
    entry = None if meta is None else it.flight.start(
        meta, loops, it.flight.next_seq(it.comm), inp.numel() * inp.element_size(), f.current)
    work = post(out, inp, f.current)
    f.env[s.handle.name] = work
    if entry is not None:
        f.posted[s.handle.name] = (entry, entry.n)
        if it.backend.name == "cuda" and torch.cuda.is_current_stream_capturing():
            entry.mark_captured()  # its event exists only in the graph: not to be asked
        else:  # a non-blocking check (CUDA: the event), or None when only its Wait tells
            entry.poll = getattr(work, "query", None)


def _wait(it: Interpreter, s: ir.Wait, f: _Frame) -> None:
    _await(it, s, f, *it.flight_of(s, f.env))


def _await(it: Interpreter, s: ir.Wait, f: _Frame, meta, loops: tuple) -> None:
    """Wait for ``s``'s collective on the current stream; recorded (``meta``)."""
    work = f.env.pop(s.handle.name)
    posted, n = f.posted.pop(s.handle.name, (None, 0))
    if posted is not None and posted.n != n:
        posted = None  # its slot was reused: more than the recorder keeps ran since
    entry = None
    if meta is not None:
        seq, nbytes = (0, 0) if posted is None else (posted.seq, posted.nbytes)
        entry = it.flight.start(meta, loops, seq, nbytes, f.current)
    work.wait(f.current)
    if entry is not None and posted is not None:
        entry.poll = posted.poll
        if posted.captured:
            entry.mark_captured()
        elif entry.poll is None and it.backend.name != "cuda":
            entry.complete()  # the host waited: the request has finished
            posted.complete()


def _matmul(it: Interpreter, s: ir.Matmul, f: _Frame) -> None:
    a, b, out = f.env[s.a.name], f.env[s.b.name], f.env[s.out.name]
    if s.epilogue is not None:
        matmul_epilogue(a, b, out, s.epilogue, f.env[s.aux.name])
        return
    if a.is_contiguous() and out.is_contiguous():
        # One GEMM over all batch rows instead of a batched call; cuBLAS or generated.
        it.matmul.run(a.reshape(-1, a.shape[-1]), b, out.view(-1, out.shape[-1]))
    else:
        torch.matmul(a, b, out=out)


def _add(it: Interpreter, s: ir.Add, f: _Frame) -> None:
    # torch's add on the current stream (CPU: at once), rounded once into out's dtype.
    torch.add(f.env[s.a.name], f.env[s.b.name], out=f.env[s.out.name])


def _launch_kernel(it: Interpreter, s: ir.LaunchKernel, f: _Frame) -> None:
    it.kernel(s.kernel)([f.env[t.name] for t in s.args], s.grid, s.block, s.smem, s.scalars,
                        f.current)


def _for_loop(it: Interpreter, s: ir.ForLoop, f: _Frame) -> None:
    for i in range(s.start, s.stop):
        f.env[s.index.name] = i
        it._body(s.body, f)
    f.env.pop(s.index.name, None)


_RULES = {
    ir.GetCurrentStream: _get_current_stream,
    ir.SetCurrentStream: _set_current_stream,
    ir.Synchronize: _synchronize,
    ir.Allocate: _allocate,
    ir.Select: _select,
    ir.Communication: _communication,
    ir.Wait: _wait,
    ir.Matmul: _matmul,
    ir.Add: _add,
    ir.LaunchKernel: _launch_kernel,
    ir.ForLoop: _for_loop,
}
