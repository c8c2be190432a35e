package io.regionbus.peers.geode;

import java.io.File;
import java.net.ServerSocket;
import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.BitSet;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.geode.cache.Region;
import org.apache.geode.cache.client.ClientCache;
import org.apache.geode.cache.client.ClientCacheFactory;
import org.apache.geode.cache.client.ClientRegionShortcut;
import org.apache.geode.cache.client.PoolFactory;
import org.apache.geode.cache.client.PoolManager;
import org.apache.geode.internal.GemFireVersion;

/**
 * The Apache Geode peer of {@code python -m bench.core}, driven by bench/peers/geode.py.
 *
 * <p>{@code run --ops N --subscribers N ...} (this JVM is the writer) measures, with the
 * key and value shapes of bench/core.py (keys {@code tp-<i mod key-space>}, byte values of
 * value-bytes whose first 8 bytes are the send time in epoch nanoseconds):
 *
 * <ol>
 *   <li>latency: puts paced at --rate for --latency-seconds to one cache server, one
 *       subscriber JVM (ALL_KEYS interest) recording put → listener latency;
 *   <li>throughput: --ops puts from --writer-threads threads (Geode's client put is
 *       synchronous; threads are its pipelining), --subscribers subscriber JVMs, after
 *       --warmup-ops puts (default 0) that every subscriber receives but no figure counts;
 *       the cache server's CPU time over the counted puts (until every subscriber had them)
 *       is its CPU per put, the cost of fanning out to the subscribers;
 *   <li>failover (unless --failover false): two servers, subscription-redundancy 1, puts of
 *       distinct keys at --failover-rate, and a SIGKILL of the subscriber's primary after
 *       --kill-after-s; lost and duplicate events at the listener. The survivor sees the
 *       primary go after --member-timeout-ms (Geode's member-timeout, 5000 by default).
 * </ol>
 *
 * <p>With {@code --reads true}, between the throughput and failover phases, {@link Reads}
 * measures {@code getAll} of --get-all-keys keys (--get-all-calls calls) and a one-shot OQL
 * query (--query-runs runs) over --read-entries entries, bench.core's phases (g) and (q).
 *
 * <p>{@code --latency false} skips the latency phase. Subscriber JVMs get
 * {@code -Xmx<--subscriber-heap>} (512m) and the space-separated {@code
 * --subscriber-jvm-options} (none), so many of them fit in memory at once.
 *
 * <p>With {@code --cq <query>} every subscriber of the latency and throughput phases holds
 * that continuous query instead of ALL_KEYS interest (bench/cq.py's workload).
 *
 * <p>It prints one JSON object on the last line of stdout; progress goes to stderr. Child
 * JVMs are {@code server} and {@code subscriber} ({@link Members}); a Geode client cache is
 * one per JVM, so each subscriber is a JVM of its own.
 */
public final class GeodePeer {
  private final Map<String, String> options;
  private final File workDir;

  private GeodePeer(Map<String, String> options) {
    this.options = options;
    this.workDir = new File(options.getOrDefault("work-dir", System.getProperty("java.io.tmpdir")));
  }

  public static void main(String[] args) throws Exception {
    switch (args.length == 0 ? "" : args[0]) {
      case "server" -> Members.server(args);
      case "subscriber" -> Members.subscriber(args);
      case "wan-receiving-site" -> Wan.receivingSite(args);
      case "wan-sending-site" -> Wan.sendingSite(args);
      case "wan" -> {
        Map<String, String> options = new HashMap<>();
        for (int i = 1; i + 1 < args.length; i += 2) {
          options.put(args[i].replaceFirst("^--", ""), args[i + 1]);
        }
        File workDir =
            new File(options.getOrDefault("work-dir", System.getProperty("java.io.tmpdir")));
        System.out.println(Members.JSON.writeValueAsString(Wan.run(options, workDir)));
        System.out.flush();
      }
      case "run" -> {
        Map<String, String> options = new HashMap<>();
        for (int i = 1; i + 1 < args.length; i += 2) {
          options.put(args[i].replaceFirst("^--", ""), args[i + 1]);
        }
        Map<String, Object> figures = new GeodePeer(options).run();
        System.out.println(Members.JSON.writeValueAsString(figures));
        System.out.flush();
      }
      default -> {
        System.err.println(
            "usage: GeodePeer run [--ops N --subscribers N ...] | wan [--mode serial|parallel"
                + " --events N --rate R --seconds S ...] | server | subscriber"
                + " | wan-receiving-site | wan-sending-site");
        System.exit(2);
      }
    }
    // Geode leaves non-daemon threads behind a closed cache.
    System.exit(0);
  }

  /** The --cq query of the subscribers, "" for ALL_KEYS interest. */
  private String cq() {
    return options.getOrDefault("cq", "");
  }

  private int intOption(String name, int fallback) {
    return Integer.parseInt(options.getOrDefault(name, Integer.toString(fallback)));
  }

  private double doubleOption(String name, double fallback) {
    return Double.parseDouble(options.getOrDefault(name, Double.toString(fallback)));
  }

  private static final long STARTED = System.nanoTime();

  static void progress(String message) {
    System.err.printf("geode-peer %.1f s: %s%n", (System.nanoTime() - STARTED) / 1e9, message);
  }

  static int freePort() throws Exception {
    try (ServerSocket socket = new ServerSocket(0)) {
      return socket.getLocalPort();
    }
  }

  private String logFile(String name) {
    return new File(workDir, name + ".log").getPath();
  }

  static byte[] stamped(int valueBytes) {
    byte[] value = new byte[valueBytes];
    Arrays.fill(value, (byte) 'x');
    ByteBuffer.wrap(value).putLong(Arrivals.nowNs());
    return value;
  }

  /** Sleep until the index-th tick of a rate-per-second schedule started at startNano. */
  static void pace(long startNano, int index, int rate) throws InterruptedException {
    long waitNs = startNano + index * (1_000_000_000L / rate) - System.nanoTime();
    if (waitNs > 0) {
      TimeUnit.NANOSECONDS.sleep(waitNs);
    }
  }

  private Map<String, Object> run() throws Exception {
    int subscribers = intOption("subscribers", 10);
    int valueBytes = intOption("value-bytes", 200);
    double idleTimeoutS = doubleOption("idle-timeout-s", 30);
    boolean failover = Boolean.parseBoolean(options.getOrDefault("failover", "true"));
    Map<String, Object> figures = new java.util.LinkedHashMap<>();
    figures.put("peer", "Apache Geode");
    figures.put("geode_version", GemFireVersion.getGemFireVersion());
    figures.put("settings", options);
    int port = freePort();
    try (Child server =
        new Child("server", workDir, "1g", "server", "" + port, logFile("server"), "0", "false",
        "" + intOption("member-timeout-ms", 5000))) {
      server.await("READY", 120);
      progress("server on port " + port);
      ClientCache cache =
          new ClientCacheFactory(Members.memberProperties(logFile("writer")))
              .addPoolServer("127.0.0.1", port)
              .create();
      try {
        Region<String, byte[]> region =
            cache
                .<String, byte[]>createClientRegionFactory(ClientRegionShortcut.PROXY)
                .create(Members.REGION);
        if (Boolean.parseBoolean(options.getOrDefault("latency", "true"))) {
          figures.put("latency", latency(region, port, valueBytes, idleTimeoutS));
        }
        figures.put(
            "throughput", throughput(region, server, port, subscribers, valueBytes, idleTimeoutS));
        if (Boolean.parseBoolean(options.getOrDefault("reads", "false"))) {
          int entries = intOption("read-entries", 10_000);
          progress("reads: getAll and an OQL query over " + entries + " entries");
          figures.put(
              "reads",
              Reads.measure(
                  cache, region, entries, intOption("get-all-keys", 100),
                  intOption("get-all-calls", 500), intOption("query-runs", 20), valueBytes));
        }
        region.localDestroyRegion();
        if (failover) {
          figures.put("failover", failover(cache, valueBytes, idleTimeoutS));
        }
      } finally {
        cache.close();
      }
    }
    return figures;
  }

  private Map<String, Object> latency(
      Region<String, byte[]> region, int port, int valueBytes, double idleTimeoutS)
      throws Exception {
    int rate = intOption("rate", 1000);
    double seconds = doubleOption("latency-seconds", 20);
    double warmupS = doubleOption("warmup-seconds", 1);
    progress("latency: " + rate + " puts/s for " + seconds + " s");
    try (Child subscriber =
        new Child(
            "latency-subscriber", workDir, subscriberHeap(), subscriberJvmOptions(),
            "subscriber", "127.0.0.1:" + port, "0", logFile("latency-subscriber"), cq())) {
      subscriber.await("READY", 120);
      int total = Math.max(1, (int) (rate * seconds));
      long firstNs = Arrivals.nowNs();
      long start = System.nanoTime();
      for (int i = 0; i < total; i++) {
        pace(start, i, rate);
        region.put("lat-" + i, stamped(valueBytes));
      }
      long fromNs = firstNs + (long) (warmupS * 1e9);
      subscriber.send("EXPECT " + total + " " + fromNs + " " + (long) (idleTimeoutS * 1000));
      Map<String, Object> result = subscriber.await("RESULT", idleTimeoutS + 180);
      result.put("sent", total);
      return result;
    }
  }

  /** The -Xmx of a subscriber JVM (--subscriber-heap, 512m). */
  private String subscriberHeap() {
    return options.getOrDefault("subscriber-heap", "512m");
  }

  /** Further JVM options of a subscriber JVM (--subscriber-jvm-options, space-separated). */
  private List<String> subscriberJvmOptions() {
    String text = options.getOrDefault("subscriber-jvm-options", "").trim();
    return text.isEmpty() ? List.of() : List.of(text.split("\\s+"));
  }

  /** What one round of puts from the writer threads did. */
  private record Round(long acked, long errors, long startNs, long lastAckNs) {}

  private static Round write(
      Region<String, byte[]> region, int ops, int keySpace, int writerThreads, int valueBytes)
      throws InterruptedException {
    AtomicLong next = new AtomicLong();
    AtomicLong acked = new AtomicLong();
    AtomicLong errors = new AtomicLong();
    AtomicLong lastAckNs = new AtomicLong();
    ExecutorService writers = Executors.newFixedThreadPool(writerThreads);
    long startNs = Arrivals.nowNs();
    for (int t = 0; t < writerThreads; t++) {
      writers.execute(() -> {
        for (long i = next.getAndIncrement(); i < ops; i = next.getAndIncrement()) {
          try {
            region.put("tp-" + (i % keySpace), stamped(valueBytes));
            acked.incrementAndGet();
          } catch (RuntimeException e) {
            errors.incrementAndGet();
          }
          lastAckNs.accumulateAndGet(Arrivals.nowNs(), Math::max);
        }
      });
    }
    writers.shutdown();
    writers.awaitTermination(1, TimeUnit.HOURS);
    return new Round(acked.get(), errors.get(), startNs, lastAckNs.get());
  }

  /** Every subscriber's answer once it has {@code expected} events (or went idle). */
  private static List<Map<String, Object>> expect(
      List<Child> children, long expected, double idleTimeoutS) throws Exception {
    for (Child child : children) {
      child.send("EXPECT " + expected + " 0 " + (long) (idleTimeoutS * 1000));
    }
    List<Map<String, Object>> results = new ArrayList<>();
    for (Child child : children) {
      results.add(child.await("RESULT", idleTimeoutS + 180));
    }
    return results;
  }

  private Map<String, Object> throughput(
      Region<String, byte[]> region, Child server, int port, int subscribers, int valueBytes,
      double idleTimeoutS) throws Exception {
    int ops = intOption("ops", 50_000);
    int warmupOps = intOption("warmup-ops", 0);
    int keySpace = intOption("key-space", 10_000);
    int writerThreads = intOption("writer-threads", 16);
    progress("throughput: " + ops + " puts (after " + warmupOps + " not counted) from "
        + writerThreads + " threads, " + subscribers + " subscribers");
    List<Child> children = new ArrayList<>();
    try {
      for (int i = 0; i < subscribers; i++) {
        children.add(new Child(
            "subscriber-" + i, workDir, subscriberHeap(), subscriberJvmOptions(),
            "subscriber", "127.0.0.1:" + port, "0", logFile("subscriber-" + i), cq()));
      }
      for (Child child : children) {
        child.await("READY", 60 + 10.0 * subscribers);
      }
      progress(subscribers + " subscribers ready");
      long warmupAcked = 0;
      if (warmupOps > 0) {
        // The server's JIT compiles its put and fan-out paths here, not in the counted puts.
        warmupAcked = write(region, warmupOps, keySpace, writerThreads, valueBytes).acked();
        expect(children, warmupAcked, idleTimeoutS);
        progress("warm-up: " + warmupAcked + " puts delivered");
      }
      Duration serverCpuBefore = server.cpu();
      Round round = write(region, ops, keySpace, writerThreads, valueBytes);
      long acked = round.acked();
      List<Map<String, Object>> results = expect(children, warmupAcked + acked, idleTimeoutS);
      Duration serverCpuAfter = server.cpu();
      long delivered = 0;
      long lastDeliveryNs = round.startNs();
      List<Long> counts = new ArrayList<>();
      for (Map<String, Object> result : results) {
        long count = ((Number) result.get("count")).longValue() - warmupAcked;
        counts.add(count);
        delivered += count;
        lastDeliveryNs = Math.max(lastDeliveryNs, ((Number) result.get("last_ns")).longValue());
      }
      double serverCpuS = serverCpuBefore == null || serverCpuAfter == null
          ? Double.NaN
          : serverCpuAfter.minus(serverCpuBefore).toNanos() / 1e9;
      double ackedS = Math.max(round.lastAckNs() - round.startNs(), 1) / 1e9;
      double deliveredS = Math.max(lastDeliveryNs - round.startNs(), 1) / 1e9;
      return Members.ordered(
          "sent", ops,
          "warmup_acked", warmupAcked,
          "acked", acked,
          "errors", round.errors(),
          "writer_threads", writerThreads,
          "puts_per_s", acked / ackedS,
          "subscribers", subscribers,
          "counts", counts,
          "delivered", delivered,
          "events_per_s", delivered == 0 ? 0.0 : delivered / deliveredS,
          "complete", counts.stream().allMatch(c -> c >= acked),
          "server_cpu_s", serverCpuS,
          "server_cpu_us_per_put", acked == 0 ? Double.NaN : serverCpuS * 1e6 / acked,
          "server_rss_bytes", server.rssBytes(),
          "subscriber_rss_max_bytes",
          children.stream().mapToLong(Child::rssBytes).max().orElse(-1));
    } finally {
      for (Child child : children) {
        child.close();
      }
    }
  }

  private Map<String, Object> failover(ClientCache cache, int valueBytes, double idleTimeoutS)
      throws Exception {
    int rate = intOption("failover-rate", 1000);
    double seconds = doubleOption("failover-seconds", 15);
    double killAfterS = doubleOption("kill-after-s", 5);
    int locatorPort = freePort();
    int[] ports = {freePort(), freePort()};
    progress("failover: 2 servers, redundancy 1, " + rate + " puts/s for " + seconds
        + " s, SIGKILL of the primary after " + killAfterS + " s");
    List<Child> servers = new ArrayList<>();
    try {
      for (int i = 0; i < 2; i++) {
        Child server = new Child(
            "failover-server-" + (i + 1), workDir, "1g", "server", "" + ports[i],
            logFile("failover-server-" + (i + 1)), "" + locatorPort, i == 0 ? "true" : "false",
            "" + intOption("member-timeout-ms", 5000));
        servers.add(server);
        server.await("READY", 120);
      }
      String addresses = "127.0.0.1:" + ports[0] + ",127.0.0.1:" + ports[1];
      try (Child tracker = new Child(
          "failover-subscriber", workDir, "512m",
          "subscriber", addresses, "1", logFile("failover-subscriber"))) {
        Map<String, Object> ready = tracker.await("READY", 120);
        int primaryPort = ((Number) ready.get("primary_port")).intValue();
        Child primary = servers.get(primaryPort == ports[0] ? 0 : 1);
        PoolFactory poolFactory = PoolManager.createFactory();
        for (int p : ports) {
          poolFactory.addServer("127.0.0.1", p);
        }
        poolFactory.create("failover");
        Region<String, byte[]> region =
            cache
                .<String, byte[]>createClientRegionFactory(ClientRegionShortcut.PROXY)
                .setPoolName("failover")
                .create(Members.REGION);
        int total = Math.max(1, (int) (rate * seconds));
        int killAt = (int) (rate * killAfterS);
        BitSet acked = new BitSet(total);
        long errors = 0;
        long killNs = 0;
        long longestPutAfterKillNs = 0;
        long start = System.nanoTime();
        for (int i = 0; i < total; i++) {
          pace(start, i, rate);
          if (i == killAt) {
            killNs = Arrivals.nowNs();
            primary.kill();
            progress("killed " + primary.name + " (pid " + primary.pid() + ")");
          }
          long putStart = System.nanoTime();
          try {
            region.put("fo-" + i, stamped(valueBytes));
            acked.set(i);
          } catch (RuntimeException e) {
            errors++;
          }
          if (killNs != 0) {
            longestPutAfterKillNs = Math.max(longestPutAfterKillNs, System.nanoTime() - putStart);
          }
        }
        tracker.send("TRACK " + acked.cardinality() + " " + killNs + " "
            + (long) (idleTimeoutS * 1000));
        Map<String, Object> result = tracker.await("RESULT", idleTimeoutS + 180);
        @SuppressWarnings("unchecked")
        List<Number> missing = (List<Number>) result.remove("missing");
        long lost = missing.stream().filter(m -> acked.get(m.intValue())).count();
        Map<String, Object> figures = Members.ordered(
            "sent", total,
            "acked", acked.cardinality(),
            "put_errors", errors,
            "killed", primary.name,
            "acked_never_delivered", lost,
            "longest_put_after_kill_ms", longestPutAfterKillNs / 1e6);
        figures.putAll(result);
        return figures;
      }
    } finally {
      for (Child server : servers) {
        server.close();
      }
    }
  }
}
