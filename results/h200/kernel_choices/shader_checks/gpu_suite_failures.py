import os


def pytest_runtest_logreport(report):
    if report.failed:
        with open(os.environ["FAILLOG"], "a") as f:
            f.write(f"==== {report.nodeid} ({report.when})\n{str(report.longrepr)[-2500:]}\n")
