from calctl.cli.app import run

run()
