"""The task layer: tasks, results and their waits, schedules."""
