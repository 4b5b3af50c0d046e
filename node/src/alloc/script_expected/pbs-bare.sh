#!/bin/bash
# A mesh node for allocation queue `cpu`, written by `mesh alloc`.
#PBS -N mesh-5f0c9a1e-cpu
#PBS -l walltime=1:00:00
#PBS -l select=1:ncpus=8
#PBS -j oe
#PBS -o /home/ada/.local/share/mesh/alloc/gpu
set -eu
export MESH_ALLOC_JOB="$PBS_JOBID"
sh -c 'exec /home/ada/bin/mesh --state-dir /scratch/ada/mesh/"$PBS_JOBID-0" join /ip4/10.0.0.5/tcp/7070/p2p/12D3KooWExample --key /home/ada/.local/share/mesh/mesh.key --listen /ip4/0.0.0.0/tcp/0 --resources "cpu=$NCPUS" --walltime 3600s'
