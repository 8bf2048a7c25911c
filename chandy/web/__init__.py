"""Flink's REST API, the dashboard and Prometheus metrics, served from the driver.

A :class:`~chandy.web.dispatcher.Dispatcher` (one per environment) holds the jobs;
a :class:`~chandy.web.server.RestServer` serves them over HTTP in Flink's JSON
shapes, so Flink's own CLI (``flink list|savepoint|stop|cancel``) drives a chandy job.
"""
