"""The tasks and their files: the registry of the papers' tasks (registry.py), their official files
read (readers.py, lines.py), split and fingerprinted (data.py), and your own CSV, TSV or JSON Lines
files as a task (own_files.py reads them, own_task.py makes them a task).
"""
