"""The lessons the Lessons tab (tabs/lessons.py) and its class mode (tabs/classroom.py) read: the engine (steps,
questions, verdicts), the course (the nine lessons in order) and one module per lesson. No module here imports a
tab, so neither page imports the other through this package."""
