export PYTHONPATH=$PWD HOSTIR_CACHE_DIR=/tmp/hc NCCL_NVLS_ENABLE=0
M=""
for r in barrier long_scoreboard short_scoreboard wait mio_throttle lg_throttle math_pipe_throttle not_selected selected membar branch_resolving dispatch_stall drain sleeping no_instruction misc tex_throttle; do M="$M,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"; done
M="gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.per_cycle_active,smsp__inst_executed.sum,lts__t_sectors.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum$M"
/usr/local/cuda/bin/ncu --clock-control none --kernel-name regex:'hostir|copy' --launch-skip-before-match 0 --metrics $M --csv --page raw python3 benchmarks/norm_ceiling_probe.py --profile --hidden 1600,4096,20480 --out /dev/null > $OUT/ncu_stalls.csv 2> $OUT/ncu_err.txt
tail -3 $OUT/ncu_err.txt; wc -l $OUT/ncu_stalls.csv
