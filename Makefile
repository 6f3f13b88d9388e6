# A user's set-up commands. Each target calls the one script that defines it (CI calls the same scripts):
#   make quickstart   install (train + dev extras), then run the whole chain on the bundled sample
#   make test         the test command CI runs (.ci/run): ruff, every test, then the agent integrations
#   make test-fast    the tests a developer runs while working: all but those marked slow (the end-to-end ones)
#   make docs         build the documentation site (mkdocs, strict)
# PYTHON picks the interpreter (default python3: inside an activated virtualenv, that virtualenv's);
# ARGS are passed to the quickstart (e.g. make quickstart ARGS="--out /tmp/qs").
PYTHON ?= python3
ARGS ?=
export PYTHON

.PHONY: install quickstart test test-fast docs

install:
	bash .ci/install

quickstart: install
	$(PYTHON) -m branchgate quickstart $(ARGS)

test:
	bash .ci/run

test-fast:
	$(PYTHON) -m pytest -m "not slow"

docs:
	$(PYTHON) -m mkdocs build --strict
