"""Batched multi-sequence decode: bucketed held plans, the batch decoder, continuous batching."""
from fuelpipe.batch.buckets import BatchSpec
from fuelpipe.batch.decoder import BatchDecoder
from fuelpipe.batch.scheduler import ContinuousBatcher, Request, RequestResult, Sampling

__all__ = ["BatchSpec", "BatchDecoder", "ContinuousBatcher", "Request", "RequestResult", "Sampling"]
