package io.regionbus.peers.geode;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Random;
import java.util.Set;
import org.apache.geode.cache.Region;
import org.apache.geode.cache.client.ClientCache;
import org.apache.geode.cache.client.ClientRegionShortcut;
import org.apache.geode.cache.query.Query;
import org.apache.geode.cache.query.SelectResults;
import org.apache.geode.pdx.JSONFormatter;

/**
 * The read phases beside bench.core's (g) and (q), with the workload of bench/reads_figures.py
 * (its constants are spelled again here): {@code Region.getAll} of --get-all-keys distinct
 * random keys of --read-entries keys {@code ga-<i>} on a PROXY client region, and the one-shot
 * query {@link #OQL} with {@code $1} = {@link #MIN_PRICE} over --read-entries JSON documents
 * (PDX, as {@link JSONFormatter} stores JSON) in region {@link #QUERY_REGION}. Calls are made
 * one at a time, after a tenth as many untimed (the JIT's warm-up).
 */
final class Reads {
  static final String QUERY_REGION = "bench_query";
  static final String OQL = "SELECT * FROM /" + QUERY_REGION + " v WHERE v.price >= $1";
  static final double MIN_PRICE = 90.0;
  private static final int FILL_CHUNK = 1_000;

  private Reads() {}

  /** bench/reads_figures.py's query_document, as JSON. */
  static String document(int index) {
    double price = index % 100 + (index / 100 % 10) / 10.0;
    return "{\"id\":" + index + ",\"price\":" + price + ",\"name\":\"item-" + index + "\"}";
  }

  /** The 1, 5 and 15 minute load averages ("?" off Linux), as bench.core records them. */
  static String loadAverage() {
    try {
      String[] fields = Files.readString(Path.of("/proc/loadavg")).trim().split("\\s+");
      return String.format(
          Locale.ROOT, "%.1f %.1f %.1f", Double.parseDouble(fields[0]), Double.parseDouble(fields[1]),
          Double.parseDouble(fields[2]));
    } catch (IOException | RuntimeException e) {
      return "?";
    }
  }

  static int warmup(int timed) {
    return Math.max(1, timed / 10);
  }

  /** One series of calls: how many, rate, p50, p99, and the values they answered. */
  private interface Call {
    int run() throws Exception;
  }

  private static Map<String, Object> timed(List<Call> calls, int warmup) throws Exception {
    for (Call call : calls.subList(0, warmup)) {
      call.run();
    }
    List<Call> timed = calls.subList(warmup, calls.size());
    double[] latenciesMs = new double[timed.size()];
    long items = 0;
    long started = System.nanoTime();
    for (int i = 0; i < timed.size(); i++) {
      long before = System.nanoTime();
      items += timed.get(i).run();
      latenciesMs[i] = (System.nanoTime() - before) / 1e6;
    }
    double elapsedS = (System.nanoTime() - started) / 1e9;
    Arrays.sort(latenciesMs);
    return Members.ordered(
        "calls", timed.size(),
        "per_s", elapsedS > 0 ? timed.size() / elapsedS : Double.NaN,
        "p50_ms", Stats.percentile(latenciesMs, 0.5),
        "p99_ms", Stats.percentile(latenciesMs, 0.99),
        "items", items);
  }

  static Map<String, Object> measure(
      ClientCache cache, Region<String, byte[]> region, int entries, int keysPerCall, int calls,
      int queryRuns, int valueBytes) throws Exception {
    String loadAverage = loadAverage();
    Map<String, byte[]> values = new HashMap<>();
    for (int i = 0; i < entries; i++) {
      values.put("ga-" + i, GeodePeer.stamped(valueBytes));
      if (values.size() == FILL_CHUNK || i == entries - 1) {
        region.putAll(values);
        values.clear();
      }
    }
    Region<String, Object> documents =
        cache.<String, Object>createClientRegionFactory(ClientRegionShortcut.PROXY)
            .create(QUERY_REGION);
    Map<String, Object> chunk = new HashMap<>();
    for (int i = 0; i < entries; i++) {
      chunk.put("q-" + i, JSONFormatter.fromJSON(document(i)));
      if (chunk.size() == FILL_CHUNK || i == entries - 1) {
        documents.putAll(chunk);
        chunk.clear();
      }
    }
    Random random = new Random(39);
    List<Call> getAlls = new ArrayList<>();
    for (int c = 0; c < warmup(calls) + calls; c++) {
      Set<String> keys = new LinkedHashSet<>();
      while (keys.size() < keysPerCall) {
        keys.add("ga-" + random.nextInt(entries));
      }
      getAlls.add(() -> (int) region.getAll(keys).values().stream().filter(v -> v != null).count());
    }
    Map<String, Object> getAll = timed(getAlls, warmup(calls));
    Query query = cache.getQueryService().newQuery(OQL);
    List<Call> runs = new ArrayList<>();
    for (int r = 0; r < warmup(queryRuns) + queryRuns; r++) {
      runs.add(() -> ((SelectResults<?>) query.execute(MIN_PRICE)).size());
    }
    Map<String, Object> queries = timed(runs, warmup(queryRuns));
    documents.localDestroyRegion();
    return Members.ordered(
        "entries", entries,
        "keys_per_call", keysPerCall,
        "oql", OQL,
        "load_average", loadAverage,
        "get_all", getAll,
        "query", queries);
  }
}
