import os

import pytest

# One BLAS / OpenMP thread per test process: the decode pools are the parallelism, and spinning
# BLAS workers on a 2-core runner only compete with them.
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")


def _normal_scheduling() -> None:
    """Back to SCHED_OTHER if this thread runs under a real-time policy. SVT-AV1 moves the
    thread that opens it to SCHED_FIFO 99 when run as root (``kohakuclip.write.scheduling``
    undoes it where we open encoders); a test that opened one unguarded would leave its worker
    real-time, and there any thread that spin-waits (BLAS workers, Go's scheduler in the S3
    server) starves the thread it waits for and the run livelocks."""
    if hasattr(os, "sched_getscheduler") and os.sched_getscheduler(0) != os.SCHED_OTHER:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


_normal_scheduling()


@pytest.fixture(autouse=True)
def _not_real_time() -> None:
    _normal_scheduling()
