#!/usr/bin/env bash
# Issue 54's checks on a device machine (JAX with CUDA, no TensorFlow): one call, logs in $OUT.
# In the order of what matters most, each under what is left of DEADLINE_S (default 535 s):
#   fill     benchmarks/device_fill.py: a batch that fills 80-90% of the device, trained plain,
#            with the monitor at its defaults and with probes forced (none may fail)
#   truth    benchmarks/gpu_truth.py: the trace mpwatch captures itself (profile=True), its
#            Tensor Core share and unknown precision beside the truth from XLA's own HLO dump
#   float8   benchmarks/float8_real.py: float8 readiness' predicted errors beside Keras' real
#            quantize("float8") on the device
#   cost     benchmarks/whole_fit.py: whole-fit and steady ratios at the defaults (10 s, 60 s)
# (Issue 27's per-part costs: CHECKS=gpu_cost, benchmarks/gpu_cost.py.)
#
# Here, once, in the repository root (Keras and its two pure-Python needs travel as wheels):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#     -d .whl keras==3.15.1 namex optree==0.20.0
# then run `bash benchmarks/device_check.sh` there with `.whl` carried and a timeout of ~570 s.
# Each step runs under what is left of DEADLINE_S and is skipped under 25 s; mpwatch is imported
# from the working tree (PYTHONPATH), so nothing is installed but the wheels.
set -u
OUT=${OUT:-/tmp/device_check}
LOGS=/tmp/device_check_logs  # each step's log and JSON, packed into $OUT/logs.tgz at the end
mkdir -p "$OUT" "$LOGS"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1 KERAS_BACKEND=jax TF_CPP_MIN_LOG_LEVEL=2
START=$(date +%s)
DEADLINE=$((START + ${DEADLINE_S:-535}))
CHECKS=${CHECKS:-fill,truth,float8,cost}
step() {  # step NAME CAP_S COMMAND...: the command's output in $OUT/NAME.log, its end printed
  local name=$1 cap=$2 left t rc
  shift 2
  left=$((DEADLINE - $(date +%s)))
  t=$((left < cap ? left : cap))
  if [ "$t" -lt 25 ]; then echo "=== skipped $name ($left s left)"; return; fi
  echo "=== $name (at most $t s) at $(($(date +%s) - START)) s"
  timeout "$t" "$@" >"$LOGS/$name.log" 2>&1
  rc=$?
  echo "rc=$rc at $(($(date +%s) - START)) s"
  grep -v -e Warning -e data_adapter -e '^  self\.' -e '^[WIE]0000' -e '^[WIE]1[0-9]' \
    -e 'warnings.warn' "$LOGS/$name.log" | tail -"${TAIL:-25}"
}
has() { [[ ",$CHECKS," == *",$1,"* ]]; }
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv 2>/dev/null
python3 -c "import jax, keras; print('jax', jax.__version__, 'keras', keras.__version__, jax.devices())"
if has fill; then
  TAIL=40 step fill 175 python3 benchmarks/device_fill.py --json "$LOGS/fill.json"
fi
if has truth; then
  step truth_transformer 70 python3 benchmarks/gpu_truth.py --model transformer \
    --policy mixed_bfloat16 --json "$LOGS/truth.json" --save /tmp/truth_files
fi
if has float8; then
  step float8 50 python3 benchmarks/float8_real.py --json "$LOGS/float8.json"
fi
if has cost; then
  step whole_fit_transformer_bf16 190 python3 benchmarks/whole_fit.py --backends jax \
    --models transformer --policy mixed_bfloat16 --batch-size 64 --seconds 10,60 --reps 1
  step whole_fit_resnet50_f16 110 python3 benchmarks/whole_fit.py --backends jax \
    --models resnet50 --policy mixed_float16 --batch-size 32 --seconds 10 --reps 1
  step whole_fit_transformer_f16 60 python3 benchmarks/whole_fit.py --backends jax \
    --models transformer --policy mixed_float16 --batch-size 64 --seconds 10 --reps 1
fi
if has gpu_cost; then
  step gpu_cost_transformer 130 python3 benchmarks/gpu_cost.py --model transformer \
    --policy mixed_bfloat16 --batch-size 64 --steps 800 --alternations 4 --json "$OUT/t.json" \
    --configs plain,plain+hook,mpwatch,mpwatch-cond,mpwatch-select,mpwatch-nograd
fi
echo "done at $(($(date +%s) - START)) s"
tar czf "$OUT/logs.tgz" -C "$LOGS" . && ls -la "$OUT"
# the trace and the dump files gpu_truth read: the truth can be recomputed offline from them
[ -d /tmp/truth_files ] && tar czf "$OUT/truth_files.tgz" -C /tmp truth_files
