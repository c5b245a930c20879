# The lease's training command, sourced by continue_head.sh and resume_head.sh (one copy of its flags): needs DT, W,
# DEV, BT and EVAL set; extra flags (--max-seconds, --resume) come as arguments.
train_head() {
  $DT train --features $W/feat --extra-features $W/feat-t --out $W/run --head-kind eagle1 --dtype bfloat16 --device $DEV \
    --epochs 60 --ttt-steps 3 --draft-vocab 8192 --batch-tokens $BT $EVAL \
    --init-head src/drafttree/assets/heads/smollm2-135m-instruct --lr 3e-4 --warmup-steps 20 --eval-every 200 \
    --save-every 100 "$@" 2>&1 | tr '\r' '\n' | grep -v "^$" | awk '/eval|epoch|Error|error|Traceback|^ |^\{|^\}/ || NR%40==1'
}
