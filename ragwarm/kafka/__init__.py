"""Kafka plumbing: the local broker launcher, topic administration, and topic replay."""
