"""A process stuck waiting (a planted hang): it touches the file named on its command line,
then waits forever on an event nobody sets. `py-spy dump` shows where it waits."""

import sys
import threading
from pathlib import Path


# --8<-- [start:hang]
def wait_for_batch(ready: Path, batch: threading.Event) -> None:
    ready.touch()  # tell the shell we are inside the wait
    batch.wait()  # nobody sets it: the process hangs here, idle


if __name__ == "__main__":
    wait_for_batch(Path(sys.argv[1]), threading.Event())
# --8<-- [end:hang]
