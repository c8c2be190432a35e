package io.regionbus.peers.geode;

/** Nearest-rank percentiles, the definition bench/report.py uses. */
final class Stats {
  private Stats() {}

  static double percentile(double[] sorted, double fraction) {
    if (sorted.length == 0) {
      return Double.NaN;
    }
    int rank = Math.max(1, (int) Math.ceil(fraction * sorted.length));
    return sorted[Math.min(rank, sorted.length) - 1];
  }
}
