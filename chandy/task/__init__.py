"""Tasks: a chain of operators run by one thread in a mailbox loop."""
