"""``python -m pygrad`` and the ``pygrad`` command: the demo (see pygrad/demo.py)."""
import sys


def run() -> None:
    """Import the demo and exit with ``demo.main()``'s status.  The import
    takes a tenth of a second (numpy, the models), before ``main``'s own
    Ctrl-C handler exists: a Ctrl-C in it ends the same way, one line and
    status 130, not a traceback."""
    try:
        from .demo import main
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
    sys.exit(main())


if __name__ == "__main__":
    run()
