"""A collective that times out on one rank because another stopped with an error of its
own names that rank (its error message, sent for `every_rank_failed`, waits unreceived)."""

import numpy as np
import pytest

pytestmark = pytest.mark.mpi(min_size=2)


def test_a_timed_out_wait_names_the_rank_that_stopped_with_an_error():
    from mpi4py import MPI

    from hostir.errors import CommTimeoutError
    from runtime import watchdog
    from runtime.comm.mpi import wait_requests

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    world.Barrier()
    if rank == 0:
        # rank 0 has an error: it tells every peer and hears from none in time
        assert not watchdog.every_rank_failed(2, timeout_s=3.0)
    else:
        # the others wait on a message rank 0 never sends, and time out first
        pending = world.Irecv(np.zeros(1, dtype=np.int32), source=0, tag=29_003)
        with pytest.raises(CommTimeoutError, match="rank 0 stopped with an error of its own"):
            wait_requests([pending], "a test receive", rank, timeout_s=1.0)
        pending.Cancel()
        pending.Wait()
        # take rank 0's error message, so that no later test finds it
        code = np.zeros(1, dtype=np.int32)
        world.Recv(code, source=0, tag=watchdog.ERROR_TAG)
        assert code[0] == 2
    world.Barrier()
