"""The assignment: the parts a student writes (parts.py: each part's file, statement, equation and
test command) and the student edition with its handout (edition.py; python -m minknn.assignment).
"""
