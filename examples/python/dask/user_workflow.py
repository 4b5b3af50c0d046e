#!/usr/bin/env python
# Seed 004's user_workflow.py (a Dask task farm on Shaheen III) on mesh.
# Changed: the two import lines and the client (marked "mesh:"); `func`,
# `params` and the loop are the seed's, as it has them. Run it in the job's
# folder (foo.txt, user_case/, wrapper.sh), as the seed's sched.slurm does:
#
#     EXP_NAME=experiment python3 user_workflow.py
#
# Each call of func runs on a node of the mesh, in this folder where the
# node sees it (this machine, a shared file system), as a Dask worker does.

import os,time, subprocess as sb
import sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "python"))  # mesh: or pip install ./python
import mesh                                    # mesh: was `from dask.distributed import Client,as_completed`
from mesh import as_completed

try:
    client = mesh.connect()                    # mesh: was `Client(scheduler_file='scheduler.json')`
except mesh.MeshError:
    client = mesh.local()                      # mesh: no node here: a throwaway one


def params(filename='foo.txt'):
    f = open(filename,'r+')
    files = f.read().splitlines() # List with stripped line-breaks 
    f.close()
    return files

def func(x,out_dir):
    fo=open(os.path.join(out_dir,'out.log'),'w+')
    fe=open(os.path.join(out_dir,'err.log'),'w+')
    
    srcdir=os.path.join(os.environ['PWD'],'user_case')
    EXE='FreeFem++-nw'

    # Pre-processing steps --  before launching the application
    o = sb.run(['rsync','-r','%s'%(os.path.join(srcdir,'pv_LIR_etau_IVCurve_SF.edp')),
        'pv_LIR_etau_IVCurve_SF.edp']
        ,cwd=out_dir)
    o = sb.run(['rsync','-r','%s'%(os.path.join(srcdir,'BF_RefMeshLIR_100x100x95x100.msh')),
        'BF_RefMeshLIR_100x100x95x100.msh']
        ,cwd=out_dir)
    o = sb.run(['rsync','-r','%s'%(os.path.join(os.environ['PWD'],'wrapper.sh')),
        'wrapper.sh']
        ,cwd=out_dir)

    # Launch the application along with its optinos as command line arugument to wrapper script 
    o = sb.run(['./wrapper.sh','%s'%(EXE),'pv_LIR_etau_IVCurve_SF.edp','%s'%(x)],
                stdout=fo,stderr=fe,
                shell=False,cwd=out_dir)
    # Post-processing steps
        # - Copy the output file and rename it to index according to the task
        # - Delete the task directory if the processing was successful
    
    return True

base_dir=os.environ['EXP_NAME']
os.makedirs(base_dir,exist_ok=True)

# the logic of parameter setting is encapsulated in params function:
x = params()

outdirs=list()
for i in range(len(x)):
    sample_dir=os.path.join(base_dir,'%s'%(str(i+1)))
    os.makedirs(sample_dir,exist_ok=True)
    outdirs.append(sample_dir)
print('outdirs[%d]:: '%(len(outdirs)),outdirs)


futures=client.map(func,x,outdirs)

for future in as_completed(futures):
    print('result: ',future.result())

client.close()
