"""Threadline: an event-sourced Kafka stream processor for durable AI-agent runs."""
