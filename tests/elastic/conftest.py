import pytest

from dl2d.elastic.cluster import LocalCluster


@pytest.fixture
def make_cluster():
    made = []

    def make(cfg, n_ps, n_workers, **kw):
        c = LocalCluster(cfg, n_ps, n_workers, **kw)
        made.append(c)
        return c.start()
    yield make
    for c in made:
        c.close()
