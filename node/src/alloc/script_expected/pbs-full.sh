#!/bin/bash
# A mesh node for allocation queue `gpu`, written by `mesh alloc`.
#PBS -N mesh-5f0c9a1e-gpu
#PBS -l walltime=1:30:00
#PBS -l select=2:ncpus=16:mem=65536mb:ngpus=2
#PBS -q gpu-long
#PBS -A proj42
#PBS -j oe
#PBS -o /home/ada/.local/share/mesh/alloc/gpu
#PBS -l place=scatter
#PBS -m n
set -eu
export MESH_ALLOC_JOB="$PBS_JOBID"
module load cuda/12
export OMP_NUM_THREADS=1
pbsdsh -u -- sh -c 'exec /home/ada/bin/mesh --state-dir /scratch/ada/mesh/"$PBS_JOBID-$PBS_VNODENUM" join /ip4/10.0.0.5/tcp/7070/p2p/12D3KooWExample --key /home/ada/.local/share/mesh/mesh.key --listen /ip4/0.0.0.0/tcp/0 --resources "cpu=$NCPUS,mem=65536MiB,gpu=2" --walltime 5400s'
