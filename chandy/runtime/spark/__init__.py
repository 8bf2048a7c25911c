"""The Spark executor: the driver is the JobMaster, a barrier stage's tasks are the slots.

Slot i runs subtask i of every job vertex (Flink's slot sharing). The slots
learn each other's addresses once (gathered by the driver) and from
then on talk TCP directly: data between slots, control to the driver. Every
connection proves it knows the job's secret before anything is read.
"""
