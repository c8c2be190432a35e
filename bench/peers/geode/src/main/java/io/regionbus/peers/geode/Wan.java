package io.regionbus.peers.geode;

import java.io.BufferedReader;
import java.io.File;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.Properties;
import org.apache.geode.cache.Cache;
import org.apache.geode.cache.CacheFactory;
import org.apache.geode.cache.Region;
import org.apache.geode.cache.RegionFactory;
import org.apache.geode.cache.RegionShortcut;
import org.apache.geode.cache.wan.GatewayReceiver;
import org.apache.geode.cache.wan.GatewayReceiverFactory;
import org.apache.geode.cache.wan.GatewaySender;
import org.apache.geode.cache.wan.GatewaySenderFactory;
import org.apache.geode.internal.GemFireVersion;

/**
 * Two Geode sites joined by a WAN gateway, the Geode peer of {@code python -m bench.gateway}:
 * site A (distributed system 1) is a locator and a server in one JVM whose region {@code
 * bench} has gateway sender {@code to-b}, serial or parallel; site B (distributed system 2)
 * is a locator and a server in another, with a gateway receiver and the region's listener
 * recording each event's arrival. Every sender and receiver setting is Geode's default
 * (batch size 100, batch time interval 1000 ms, 5 dispatcher threads for a serial sender,
 * no conflation), as a user of Geode starts with.
 *
 * <p>{@code wan --mode serial|parallel --events N --rate R --seconds S ...} (this JVM) starts
 * both sites, then measures:
 *
 * <ol>
 *   <li>throughput: site A's server puts --events values as fast as one thread can
 *       (a server-side put returns once the event is queued for the sender); events/s is
 *       --events over the time from the first put to the last arrival at site B;
 *   <li>lag: puts paced at --rate for --seconds; the latency from each put's stamped send
 *       time to its arrival at site B's listener, p50 / p99 / max, after the first
 *       --lag-warmup-s seconds (3).
 * </ol>
 *
 * <p>Both phases follow --warmup-events puts that site B must receive first (the sender has
 * then found the receiver). Keys are {@code tp-<i mod key-space>}, values --value-bytes
 * bytes whose first 8 are the send time (bench/workers.py's stamp).
 */
final class Wan {
  static final String SENDER = "to-b";

  private Wan() {}

  private static Properties siteProperties(String logFile, int siteId, int locatorPort) {
    Properties properties = Members.serverProperties(logFile);
    properties.setProperty("distributed-system-id", Integer.toString(siteId));
    properties.setProperty("locators", "127.0.0.1[" + locatorPort + "]");
    properties.setProperty("start-locator", "127.0.0.1[" + locatorPort + "]");
    return properties;
  }

  /**
   * {@code wan-receiving-site <locator-port> <receiver-port> <log-file> <serial|parallel>}:
   * site B. Answers {@code EXPECT} as a subscriber does ({@link Members}).
   */
  static void receivingSite(String[] args) throws Exception {
    int locatorPort = Integer.parseInt(args[1]);
    int receiverPort = Integer.parseInt(args[2]);
    boolean parallel = args[4].equals("parallel");
    Cache cache = new CacheFactory(siteProperties(args[3], 2, locatorPort)).create();
    Arrivals arrivals = new Arrivals();
    RegionFactory<String, byte[]> regions =
        cache.createRegionFactory(parallel ? RegionShortcut.PARTITION : RegionShortcut.REPLICATE);
    regions.addCacheListener(Members.recording(arrivals));
    regions.create(Members.REGION);
    GatewayReceiverFactory receivers = cache.createGatewayReceiverFactory();
    receivers.setStartPort(receiverPort);
    receivers.setEndPort(receiverPort);
    receivers.setBindAddress("127.0.0.1");
    receivers.setHostnameForSenders("127.0.0.1");
    GatewayReceiver receiver = receivers.create();
    if (!receiver.isRunning()) {
      receiver.start();
    }
    Members.say("READY", Map.of("receiver_port", receiver.getPort(), "pid", pid()));
    Members.waitForStdinClosed(arrivals);
    cache.close();
  }

  /**
   * {@code wan-sending-site <locator-port> <remote-locator-port> <log-file>
   * <serial|parallel>}: site A. Answers {@code WRITE <n> <rate, 0: at once> <value-bytes>
   * <key-space> <first-index>} with the time of its first and last put.
   */
  static void sendingSite(String[] args) throws Exception {
    int locatorPort = Integer.parseInt(args[1]);
    int remoteLocatorPort = Integer.parseInt(args[2]);
    boolean parallel = args[4].equals("parallel");
    Properties properties = siteProperties(args[3], 1, locatorPort);
    properties.setProperty("remote-locators", "127.0.0.1[" + remoteLocatorPort + "]");
    Cache cache = new CacheFactory(properties).create();
    GatewaySenderFactory senders = cache.createGatewaySenderFactory();
    senders.setParallel(parallel);
    GatewaySender sender = senders.create(SENDER, 2);
    RegionFactory<String, byte[]> regions =
        cache.createRegionFactory(parallel ? RegionShortcut.PARTITION : RegionShortcut.REPLICATE);
    regions.addGatewaySenderId(SENDER);
    Region<String, byte[]> region = regions.create(Members.REGION);
    Members.say(
        "READY",
        Map.of("sender_running", sender.isRunning(), "parallel", sender.isParallel(), "pid", pid()));
    BufferedReader in =
        new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    String line;
    while ((line = in.readLine()) != null) {
      String[] words = line.trim().split("\\s+");
      if (!words[0].equals("WRITE") || words.length < 6) {
        continue;
      }
      int count = Integer.parseInt(words[1]);
      int rate = Integer.parseInt(words[2]);
      int valueBytes = Integer.parseInt(words[3]);
      int keySpace = Integer.parseInt(words[4]);
      long firstIndex = Long.parseLong(words[5]);
      long startNano = System.nanoTime();
      long firstNs = Arrivals.nowNs();
      for (int i = 0; i < count; i++) {
        if (rate > 0) {
          GeodePeer.pace(startNano, i, rate);
        }
        region.put("tp-" + ((firstIndex + i) % keySpace), GeodePeer.stamped(valueBytes));
      }
      Members.say("RESULT", Map.of("first_ns", firstNs, "last_ns", Arrivals.nowNs(), "sent", count));
    }
    cache.close();
  }

  private static long pid() {
    return ProcessHandle.current().pid();
  }

  /** The orchestration of {@code wan}: both sites as child JVMs, then the two phases. */
  static Map<String, Object> run(Map<String, String> options, File workDir) throws Exception {
    String mode = options.getOrDefault("mode", "serial");
    int events = Integer.parseInt(options.getOrDefault("events", "20000"));
    int rate = Integer.parseInt(options.getOrDefault("rate", "500"));
    int seconds = Integer.parseInt(options.getOrDefault("seconds", "10"));
    int warmup = Integer.parseInt(options.getOrDefault("warmup-events", "1000"));
    int valueBytes = Integer.parseInt(options.getOrDefault("value-bytes", "200"));
    int keySpace = Integer.parseInt(options.getOrDefault("key-space", "10000"));
    double idleS = Double.parseDouble(options.getOrDefault("idle-timeout-s", "60"));
    double lagWarmupS = Double.parseDouble(options.getOrDefault("lag-warmup-s", "3"));
    String heap = options.getOrDefault("site-heap", "1g");
    int locatorA = GeodePeer.freePort();
    int locatorB = GeodePeer.freePort();
    int receiverPort = GeodePeer.freePort();
    long idleMs = (long) (idleS * 1000);
    try (Child siteB =
            new Child(
                "site-b", workDir, heap, "wan-receiving-site", Integer.toString(locatorB),
                Integer.toString(receiverPort), new File(workDir, "site-b.log").getPath(), mode);
        Child siteA =
            startSendingSite(siteB, workDir, heap, locatorA, locatorB, mode)) {
      GeodePeer.progress("both sites up (" + mode + " sender); warming up with " + warmup + " events");
      long index = 0;
      siteA.send(String.join(" ", "WRITE", Integer.toString(warmup), "0",
          Integer.toString(valueBytes), Integer.toString(keySpace), Long.toString(index)));
      siteA.await("RESULT", idleS);
      index += warmup;
      siteB.send("EXPECT " + index + " 0 " + idleMs);
      Map<String, Object> warmed = siteB.await("RESULT", idleS + 60);
      if (((Number) warmed.get("count")).longValue() < index) {
        throw new IllegalStateException("site B received " + warmed.get("count") + " of the "
            + index + " warm-up events");
      }

      GeodePeer.progress("throughput: " + events + " events as fast as site A puts them");
      siteA.send(String.join(" ", "WRITE", Integer.toString(events), "0",
          Integer.toString(valueBytes), Integer.toString(keySpace), Long.toString(index)));
      Map<String, Object> written = siteA.await("RESULT", idleS + events / 100.0);
      index += events;
      siteB.send("EXPECT " + index + " 0 " + idleMs);
      Map<String, Object> arrived = siteB.await("RESULT", idleS + events / 100.0);
      long firstNs = ((Number) written.get("first_ns")).longValue();
      long lastArrivalNs = ((Number) arrived.get("last_ns")).longValue();
      long received = ((Number) arrived.get("count")).longValue();
      double eventsPerS = events / ((lastArrivalNs - firstNs) / 1e9);

      int paced = rate * seconds;
      GeodePeer.progress("lag: " + paced + " events at " + rate + "/s");
      long lagFromNs = Arrivals.nowNs();
      siteA.send(String.join(" ", "WRITE", Integer.toString(paced), Integer.toString(rate),
          Integer.toString(valueBytes), Integer.toString(keySpace), Long.toString(index)));
      siteA.await("RESULT", idleS + seconds * 2.0);
      index += paced;
      // The first --lag-warmup-s seconds of the paced puts are not counted (bench.gateway's
      // warm-up of its lag phase).
      siteB.send("EXPECT " + index + " " + (lagFromNs + (long) (lagWarmupS * 1e9)) + " " + idleMs);
      Map<String, Object> lag = siteB.await("RESULT", idleS + seconds * 2.0);
      return Members.ordered(
          "geode_version", GemFireVersion.getGemFireVersion(),
          "mode", mode,
          "events", events,
          "received", received - warmup,
          "events_per_s", eventsPerS,
          "lag_rate", rate,
          "lag_events", paced,
          "lag_received", ((Number) lag.get("count")).longValue() - index + paced,
          "lag_samples", lag.get("latency_samples"),
          "lag_p50_ms", lag.get("p50_ms"),
          "lag_p99_ms", lag.get("p99_ms"),
          "lag_max_ms", lag.get("max_ms"));
    }
  }

  private static Child startSendingSite(
      Child siteB, File workDir, String heap, int locatorA, int locatorB, String mode)
      throws Exception {
    siteB.await("READY", 180);
    Child siteA =
        new Child(
            "site-a", workDir, heap, "wan-sending-site", Integer.toString(locatorA),
            Integer.toString(locatorB), new File(workDir, "site-a.log").getPath(), mode);
    siteA.await("READY", 180);
    return siteA;
  }
}
