"""``meshscope forecast``: what a traced job costs on a cluster it has not run on yet.

From a trace (a fake world of the job's real size, fake tensors) it takes each rank class's calls, the
compute between them and the memory it held, and puts them on a named cluster (`cluster`): the step
time, the exposed communication per axis and the peak memory per rank class.
"""
