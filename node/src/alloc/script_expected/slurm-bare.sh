#!/bin/bash
# A mesh node for allocation queue `cpu`, written by `mesh alloc`.
#SBATCH --job-name=mesh-5f0c9a1e-cpu
#SBATCH --time=1:00:00
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=8
#SBATCH --output=/home/ada/.local/share/mesh/alloc/gpu/%x-%j.out
#SBATCH --signal=TERM@60
set -eu
export MESH_ALLOC_JOB="${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}}"
export MESH_ALLOC_JOB="${MESH_ALLOC_JOB:-$SLURM_JOB_ID}"
srun --ntasks-per-node=1 sh -c 'exec /home/ada/bin/mesh --state-dir /scratch/ada/mesh/"$SLURM_JOB_ID-$SLURM_PROCID" join /ip4/10.0.0.5/tcp/7070/p2p/12D3KooWExample --key /home/ada/.local/share/mesh/mesh.key --listen /ip4/0.0.0.0/tcp/0 --resources "cpu=$SLURM_CPUS_PER_TASK" --walltime 3600s'
