python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
timeout 120 python3 gpu_run/trace_step.py /tmp/l3 2>&1 | grep -v "Warn\|warn_once\|Loading\|Writing"
ls -la $OUT
