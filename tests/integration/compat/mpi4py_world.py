"""mpi4py, as its docs show: COMM_WORLD's rank and size, and an allreduce."""

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
total = comm.allreduce(rank + 1, op=MPI.SUM)
print(f"COMPAT row=mpi4py rank={rank} world={size} sum={total} via=COMM_WORLD", flush=True)
