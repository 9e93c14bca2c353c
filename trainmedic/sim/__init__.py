"""The simulated cluster: the only fake in trainmedic, and it fakes hardware only.

Each node is a directory with a fault state, a kernel log and wrappers for the commands a
real GPU node has (nvidia-smi, dmesg, nccl-tests all_gather_perf, dcgmi). Those commands
behave as the real ones do for the node's fault; everything above them (Ansible, the
scheduler adapter, Prefect) is the real thing.
"""
