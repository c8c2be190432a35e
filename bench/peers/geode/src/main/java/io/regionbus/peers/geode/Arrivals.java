package io.regionbus.peers.geode;

import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.BitSet;
import java.util.List;
import java.util.Map;
import java.util.function.LongSupplier;

/**
 * What one subscriber's listener saw: every event's receive time and the send time stamped
 * in its value (8 bytes, big-endian nanoseconds since the epoch, as bench/workers.py
 * stamps them), and for keys {@code fo-<i>} which puts arrived and how often.
 */
final class Arrivals {
  private long count;
  private long firstNs;
  private long lastNs;
  private long[] sentNs = new long[1 << 16];
  private long[] receivedNs = new long[1 << 16];
  private final BitSet seen = new BitSet();
  private long distinct;
  private long duplicates;

  static long nowNs() {
    java.time.Instant now = java.time.Instant.now();
    return now.getEpochSecond() * 1_000_000_000L + now.getNano();
  }

  synchronized void hit(String key, byte[] value) {
    long now = nowNs();
    if (count == 0) {
      firstNs = now;
    }
    lastNs = now;
    if (count == sentNs.length) {
      sentNs = Arrays.copyOf(sentNs, sentNs.length * 2);
      receivedNs = Arrays.copyOf(receivedNs, receivedNs.length * 2);
    }
    sentNs[(int) count] = value != null && value.length >= 8 ? ByteBuffer.wrap(value).getLong() : 0;
    receivedNs[(int) count] = now;
    count++;
    if (key.startsWith("fo-")) {
      int index = Integer.parseInt(key.substring(3));
      if (seen.get(index)) {
        duplicates++;
      } else {
        seen.set(index);
        distinct++;
      }
    }
    notifyAll();
  }

  synchronized long count() {
    return count;
  }

  synchronized long distinct() {
    return distinct;
  }

  /** Wait until {@code progress} reaches {@code expected}, or it stood still for idleMs. */
  synchronized void await(LongSupplier progress, long expected, long idleMs)
      throws InterruptedException {
    long last = -1;
    long lastChange = System.nanoTime();
    while (progress.getAsLong() < expected) {
      long now = System.nanoTime();
      if (progress.getAsLong() != last) {
        last = progress.getAsLong();
        lastChange = now;
      } else if (now - lastChange > idleMs * 1_000_000L) {
        return;
      }
      wait(50);
    }
  }

  /** Count, first and last receive times, and latency percentiles from fromNs on. */
  synchronized Map<String, Object> tally(long fromNs) {
    double[] latencies = latenciesMs(fromNs, Long.MAX_VALUE);
    return Members.ordered(
        "count", count,
        "first_ns", firstNs,
        "last_ns", lastNs,
        "latency_samples", latencies.length,
        "p50_ms", Stats.percentile(latencies, 0.5),
        "p99_ms", Stats.percentile(latencies, 0.99),
        "max_ms", latencies.length == 0 ? Double.NaN : latencies[latencies.length - 1]);
  }

  private double[] latenciesMs(long fromNs, long untilNs) {
    double[] out = new double[(int) count];
    int n = 0;
    for (int i = 0; i < count; i++) {
      if (sentNs[i] >= fromNs && sentNs[i] < untilNs) {
        out[n++] = (receivedNs[i] - sentNs[i]) / 1e6;
      }
    }
    double[] sorted = Arrays.copyOf(out, n);
    Arrays.sort(sorted);
    return sorted;
  }

  /**
   * The failover figures: puts of {@code 0..expected-1} never seen, duplicates, the first
   * arrival of a put sent after the kill, the longest silence after the kill, and the
   * latency of puts sent before and after it.
   */
  synchronized Map<String, Object> failover(long expected, long killNs) {
    List<Integer> missing = new ArrayList<>();
    for (int i = seen.nextClearBit(0); i < expected; i = seen.nextClearBit(i + 1)) {
      missing.add(i);
    }
    long firstAfterKillNs = Long.MAX_VALUE;
    long previous = killNs;
    long longestSilenceNs = 0;
    for (int i = 0; i < count; i++) {
      if (receivedNs[i] >= killNs) {
        longestSilenceNs = Math.max(longestSilenceNs, receivedNs[i] - previous);
        previous = receivedNs[i];
      }
      if (sentNs[i] >= killNs) {
        firstAfterKillNs = Math.min(firstAfterKillNs, receivedNs[i]);
      }
    }
    double[] before = latenciesMs(0, killNs);
    double[] after = latenciesMs(killNs, Long.MAX_VALUE);
    return Members.ordered(
        "count", count,
        "distinct", distinct,
        "duplicates", duplicates,
        "missing", missing,
        "kill_to_first_event_after_kill_ms",
        firstAfterKillNs == Long.MAX_VALUE ? Double.NaN : (firstAfterKillNs - killNs) / 1e6,
        "longest_silence_after_kill_ms", longestSilenceNs / 1e6,
        "p50_before_kill_ms", Stats.percentile(before, 0.5),
        "p99_before_kill_ms", Stats.percentile(before, 0.99),
        "max_latency_after_kill_ms", after.length == 0 ? Double.NaN : after[after.length - 1]);
  }
}
