# Warp stall reasons, issue activity and DRAM/L2 traffic of the normalization kernels
# beside the copies (Nsight Compute), per hidden size: HIDDEN=4096,5140 bash benchmarks/ncu_stalls.sh
# (raw/ncu_stalls_29ef464.csv is HIDDEN=4096,5140).
export PYTHONPATH=$PWD HOSTIR_CACHE_DIR=/tmp/hc NCCL_NVLS_ENABLE=0
M=""
for r in barrier long_scoreboard short_scoreboard wait mio_throttle lg_throttle math_pipe_throttle not_selected selected membar branch_resolving dispatch_stall drain sleeping no_instruction misc tex_throttle; do M="$M,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"; done
M="gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,dram__bytes_write.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.per_cycle_active,smsp__inst_executed.sum,lts__t_sectors.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_write.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,sm__cycles_active.avg,smsp__cycles_active.avg$M"
/usr/local/cuda/bin/ncu --clock-control none --kernel-name regex:'hostir|copy' --launch-skip-before-match 0 --metrics $M --csv --page raw python3 benchmarks/norm_ceiling_probe.py --profile --hidden ${HIDDEN:-1600,4096,20480} --out /dev/null > $OUT/ncu_stalls.csv 2> $OUT/ncu_err.txt
tail -3 $OUT/ncu_err.txt; wc -l $OUT/ncu_stalls.csv
