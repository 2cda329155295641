"""The RunAI backend: the scheduler (runai) and the CLI's commands (commands: v2's submit, both CLIs' lifecycle)."""
