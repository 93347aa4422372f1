#!/usr/bin/env bash
# Launch a training run on every worker of a Cloud TPU pod slice (v5e / v5p / v4).
# Each worker runs the same main.py; jax.distributed.initialize() discovers the pod on its own, each
# host reads only its shard of the data, and orbax writes one sharded checkpoint to a shared --workdir.
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: tools/launch_tpu_pod.sh --tpu NAME --zone ZONE --config CONFIG --workdir gs://BUCKET/RUN [options] [-- main.py flags]

  --tpu NAME         TPU VM name (gcloud compute tpus tpu-vm create ...)
  --zone ZONE        its zone, e.g. us-east5-a
  --project PROJECT  GCP project (default: gcloud's current one)
  --config CONFIG    config file[:preset], e.g. configs/smollm135m_t2mlr.py
  --workdir DIR      run directory all workers can reach (a gs:// bucket path)
  --repo URL         git URL of t2mlr-jax to clone on the workers (default: copy this checkout with scp)
  --setup            (re)install the package and jax[tpu] on every worker first
  -h, --help         this help
Everything after `--` is passed to main.py (e.g. --config.mesh.fsdp=-1).
USAGE
}

TPU= ZONE= PROJECT= CONFIG= WORKDIR= REPO= SETUP=0 EXTRA=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tpu) TPU=$2; shift 2 ;;
    --zone) ZONE=$2; shift 2 ;;
    --project) PROJECT=$2; shift 2 ;;
    --config) CONFIG=$2; shift 2 ;;
    --workdir) WORKDIR=$2; shift 2 ;;
    --repo) REPO=$2; shift 2 ;;
    --setup) SETUP=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) echo "launch_tpu_pod.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for v in TPU ZONE CONFIG WORKDIR; do
  [[ -n "${!v}" ]] || { echo "launch_tpu_pod.sh: --${v,,} is required (see --help)" >&2; exit 2; }
done

GCLOUD=(gcloud compute tpus tpu-vm)
WHERE=(--zone="$ZONE" ${PROJECT:+--project="$PROJECT"})
if [[ $SETUP == 1 ]]; then
  if [[ -n "$REPO" ]]; then
    "${GCLOUD[@]}" ssh "$TPU" "${WHERE[@]}" --worker=all --command="rm -rf ~/t2mlr-jax && git clone $REPO ~/t2mlr-jax"
  else
    tar czf /tmp/t2mlr-jax.tgz --exclude=.venv --exclude=runs --exclude=.git .
    "${GCLOUD[@]}" scp /tmp/t2mlr-jax.tgz "$TPU": "${WHERE[@]}" --worker=all
    "${GCLOUD[@]}" ssh "$TPU" "${WHERE[@]}" --worker=all --command="mkdir -p ~/t2mlr-jax && tar xzf ~/t2mlr-jax.tgz -C ~/t2mlr-jax"
  fi
  "${GCLOUD[@]}" ssh "$TPU" "${WHERE[@]}" --worker=all --command="cd ~/t2mlr-jax && python3 -m venv .venv && \
    .venv/bin/pip install -q -e . 'jax[tpu]' -f https://storage.googleapis.com/jax-releases/libtpu_releases.html"
fi
"${GCLOUD[@]}" ssh "$TPU" "${WHERE[@]}" --worker=all --command="cd ~/t2mlr-jax && \
  .venv/bin/python main.py --config=$CONFIG --workdir=$WORKDIR ${EXTRA[*]:-}"
