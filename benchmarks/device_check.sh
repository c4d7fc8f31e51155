#!/usr/bin/env bash
# Issue 27's checks on a device machine (JAX with CUDA, no TensorFlow): one call, logs in $OUT.
# (An H200's first MobileNetV2 compile in a process took 79 s: the whole-fit rows come last.)
#
# Here, once, in the repository root (Keras and its two pure-Python needs travel as wheels):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#     -d .whl keras==3.15.1 namex optree==0.20.0
# then run `bash benchmarks/device_check.sh` there with `.whl` carried and a timeout of ~570 s.
# Each step runs under what is left of DEADLINE_S (default 535 s) and is skipped under 25 s;
# mpwatch is imported from the working tree (PYTHONPATH), so nothing is installed but the wheels.
set -u
OUT=${OUT:-/tmp/device_check}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1 KERAS_BACKEND=jax TF_CPP_MIN_LOG_LEVEL=2
START=$(date +%s)
DEADLINE=$((START + ${DEADLINE_S:-535}))
step() {  # step NAME CAP_S COMMAND...: the command's output in $OUT/NAME.log, its end printed
  local name=$1 cap=$2 left t rc
  shift 2
  left=$((DEADLINE - $(date +%s)))
  t=$((left < cap ? left : cap))
  if [ "$t" -lt 25 ]; then echo "=== skipped $name ($left s left)"; return; fi
  echo "=== $name (at most $t s) at $(($(date +%s) - START)) s"
  timeout "$t" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  echo "rc=$rc at $(($(date +%s) - START)) s"
  grep -v -e Warning -e data_adapter -e '^  self\.' -e '^[WIE]0000' -e '^[WIE]1[0-9]' \
    "$OUT/$name.log" | tail -30
}
nvidia-smi -L 2>/dev/null
python3 -c "import jax, keras; print('jax', jax.__version__, 'keras', keras.__version__, jax.devices())"
# "mpwatch" is the default: on a GPU, the gradient counts in a program of their own (apart)
step gpu_cost_transformer 130 python3 benchmarks/gpu_cost.py --model transformer \
  --policy mixed_bfloat16 --batch-size 64 --steps 800 --alternations 4 --json "$OUT/t.json" \
  --configs plain,plain+hook,mpwatch,mpwatch-cond,mpwatch-select,mpwatch-nograd
step gpu_cost_resnet50 150 python3 benchmarks/gpu_cost.py --model resnet50 --policy mixed_float16 \
  --batch-size 8 --steps 200 --alternations 4 --configs plain,mpwatch,mpwatch-cond,mpwatch-nograd
step whole_fit_mobilenetv2 260 python3 benchmarks/whole_fit.py --backends jax \
  --models mobilenetv2 --policy mixed_bfloat16 --seconds 60 --reps 1
step whole_fit_transformer 200 python3 benchmarks/whole_fit.py --backends jax \
  --models transformer --policy mixed_bfloat16 --seconds 10,60 --reps 1
echo "done at $(($(date +%s) - START)) s"
