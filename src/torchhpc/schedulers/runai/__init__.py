"""The RunAI backend: the scheduler (runai) and the v2 CLI's commands (runai_cli)."""
