.PHONY: setup test unit lint bench demo

setup:
	bash scripts/setup.sh --dev

test:
	bash scripts/test.sh

unit:
	.venv/bin/pytest -q tests/unit

lint:
	.venv/bin/ruff check src tests bench
	.venv/bin/mypy

bench:
	.venv/bin/python bench/run.py

demo:
	bash scripts/demo.sh
