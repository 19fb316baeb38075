export LD_LIBRARY_PATH=$PWD/.device/cuda/bin:$LD_LIBRARY_PATH
B=.device/cuda/bin
mkdir -p $OUT
( $B/test_moe_decode 2>&1 | tail -4; $B/test_rmsnorm_cuda 2>&1 | tail -3 ) > $OUT/test.log 2>&1
( timeout 100 $B/bench_moe_decode 20b 2>&1 ) > $OUT/bench_moe.log 2>&1
$B/osprey make-model --preset 20b --seed 1 --out /dev/shm/m20 > /dev/null 2>&1
for v in 0 1; do OSPREY_MOE_DECODE=$v timeout 150 $B/osprey bench decode --model /dev/shm/m20 --contexts 1024 --batches 1,8 --steps 64 > $OUT/dec20_$v.log 2>&1; done
cat $OUT/test.log; grep -h "moe_decode (PDL)\|auto" $OUT/bench_moe.log; grep -h "tokens/s" $OUT/dec20_*.log
