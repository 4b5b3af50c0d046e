#!/bin/bash
# Steps common to every task: set up the software environment, then run
# the command line the workflow passes in. On Shaheen III this is where
#   module swap PrgEnv-cray PrgEnv-gnu; module load freefem/4.7
# goes; here the environment is already right.
echo "running $@"
"$@"
