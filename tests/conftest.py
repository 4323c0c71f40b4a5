import os

import pytest

from tests.servers import normal_scheduling_here, ray_cluster

# One BLAS / OpenMP thread per test process: the decode pools are the parallelism, and spinning
# BLAS workers on a 2-core runner only compete with them.
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")


normal_scheduling_here()


@pytest.fixture(autouse=True)
def _not_real_time() -> None:
    normal_scheduling_here()


@pytest.fixture(scope="module")
def local_ray():
    """A real local Ray cluster with 2 CPUs for a module's Ray tests, shut down after them."""
    pytest.importorskip("ray")
    with ray_cluster() as ray:
        yield ray
