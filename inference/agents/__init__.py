"""The agent integrations: plug-ins that gate and record GPT-Researcher, open_deep_research and any function."""

if __name__.partition(".")[0] not in ("branchgate", "__main__", "__mp_main__"):  # the root is the package
    raise ImportError(f"import branchgate.{__name__} (the repository root is the branchgate package), not {__name__}")
