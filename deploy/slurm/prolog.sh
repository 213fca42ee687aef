#!/bin/bash
# Slurm Prolog (slurm.conf: Prolog=/etc/slurm/prolog.d/flashfeed-warm.sh, with
# PrologFlags=Alloc so it runs on every allocated node when the job starts): warm this
# node's share of the job's dataset through the node service, before the job's first step.
#
# A job asks for it in its comment:  sbatch --comment "flashfeed-warm=s3://flashfeed/photos-v1
#   ranks-per-node=8 epochs=3 seed=0" train.sbatch
# The warm runs as the job's user (the service's tenant, charged to job slurm-<id>) with that
# user's own store credentials; the node rank is SLURM_NODEID's order, the order of
# `scontrol show hostnames` of the job's node list. A failed warm never fails the job
# (a failing prolog would drain the node): the loader then fetches what is missing.
# The warm's `timeout` must stay under slurm.conf's PrologEpilogTimeout.
set -u

SOCKET=${FLASHFEED_NODE_SOCKET:-/run/flashfeed/node.sock}
FLASHFEED=${FLASHFEED:-/opt/flashfeed/venv/bin/flashfeed}
LOGDIR=${LOGDIR:-/var/log/flashfeed}
LOG=$LOGDIR/warm-${SLURM_JOB_ID}.log

[ -S "$SOCKET" ] || exit 0
comment=$(squeue --noheader --jobs "$SLURM_JOB_ID" --format %k)
case "$comment" in *flashfeed-warm=*) ;; *) exit 0 ;; esac

dataset="" ranks=1 epochs=1 seed=0
for word in $comment; do
    case "$word" in
        flashfeed-warm=*) dataset=${word#flashfeed-warm=} ;;
        ranks-per-node=*) ranks=${word#ranks-per-node=} ;;
        epochs=*) epochs=${word#epochs=} ;;
        seed=*) seed=${word#seed=} ;;
    esac
done
[ -n "$dataset" ] || exit 0
for n in "$ranks" "$epochs" "$seed"; do
    case "$n" in '' | *[!0-9]*) echo "flashfeed-warm: not a number: $n" >&2; exit 0 ;; esac
done

mapfile -t hosts < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
num_nodes=${#hosts[@]}
node_rank=${SLURM_NODEID:-}
if [ -z "$node_rank" ]; then  # not every Slurm sets SLURM_NODEID for the prolog
    for i in "${!hosts[@]}"; do
        [ "${hosts[$i]}" = "$SLURMD_NODENAME" ] && node_rank=$i
    done
fi
[ -n "$node_rank" ] || exit 0

mkdir -p "$LOGDIR"
home=$(getent passwd "$SLURM_JOB_USER" | cut -d: -f6)
runuser -u "$SLURM_JOB_USER" -- env HOME="$home" \
    FLASHFEED_NODE_SOCKET="$SOCKET" FLASHFEED_JOB="slurm-$SLURM_JOB_ID" \
    timeout 3600 "$FLASHFEED" cache warm "$dataset" \
    --node-rank "$node_rank" --num-nodes "$num_nodes" \
    --ranks-per-node "$ranks" --epochs "$epochs" --seed "$seed" --no-progress >>"$LOG" 2>&1 \
    || echo "flashfeed warm of $dataset on $(hostname) failed (see $LOG); the job reads from the store" >&2
exit 0
