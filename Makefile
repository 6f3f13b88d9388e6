# A user's set-up commands. Each target calls the one script that defines it (CI calls the same scripts):
#   make quickstart   install (.ci/install: train, dev, serve, redis extras), then run the whole chain on the sample
#   make test         the test command CI runs (.ci/run): ruff, every test, then the agent integrations
#   make test-fast    the tests a developer runs while working: all but those marked slow (the end-to-end ones)
#   make wheel        the wheel for a core install elsewhere: dist/branchgate-*.whl (python -m build, dev extra)
#   make docs         build the documentation site (mkdocs, strict)
# PYTHON picks the interpreter (default python3: inside an activated virtualenv, that virtualenv's);
# ARGS are passed to the quickstart (e.g. make quickstart ARGS="--out /tmp/qs").
PYTHON ?= python3
ARGS ?=
export PYTHON

.PHONY: install quickstart test test-fast docs wheel

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

wheel:
	$(PYTHON) -m build --wheel
