"""PyFlink's ``pyflink.datastream.async_retry_predicates``: when an async request is retried."""

from chandy.core.async_retry import empty_result_predicate, exception_type_predicate, has_exception_predicate

__all__ = ["empty_result_predicate", "exception_type_predicate", "has_exception_predicate"]
