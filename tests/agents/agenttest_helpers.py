"""Helpers of the agent tests (a unique module name; see tests/policy/policytest_helpers.py for why)."""
import time


def wait_until(pred, timeout: float = 10.0, step: float = 0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(step)
    return False
