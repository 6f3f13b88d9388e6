"""The agent integrations: plug-ins that gate and record GPT-Researcher, open_deep_research and any function."""
