"""The soak: days of running, in minutes (`make soak`, `python -m bench.soak`).

`run` starts the processes and plays the tasks and faults, `verdict` judges the rows,
`__main__` prints them as a table, minute by minute, and exits 1 on a failed criterion.
"""
