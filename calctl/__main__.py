from calctl.cli import run

run()
