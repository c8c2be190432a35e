package io.regionbus.peers.geode;

import com.fasterxml.jackson.core.json.JsonReadFeature;
import com.fasterxml.jackson.core.json.JsonWriteFeature;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.json.JsonMapper;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.geode.cache.Cache;
import org.apache.geode.cache.CacheFactory;
import org.apache.geode.cache.EntryEvent;
import org.apache.geode.cache.InterestResultPolicy;
import org.apache.geode.cache.Region;
import org.apache.geode.cache.RegionShortcut;
import org.apache.geode.cache.client.ClientCache;
import org.apache.geode.cache.client.ClientCacheFactory;
import org.apache.geode.cache.client.ClientRegionShortcut;
import org.apache.geode.cache.client.PoolManager;
import org.apache.geode.cache.client.internal.PoolImpl;
import org.apache.geode.cache.query.CqAttributesFactory;
import org.apache.geode.cache.query.CqEvent;
import org.apache.geode.cache.query.CqListener;
import org.apache.geode.cache.query.CqQuery;
import org.apache.geode.cache.server.CacheServer;
import org.apache.geode.cache.util.CacheListenerAdapter;

/**
 * The child JVMs of the harness: a cache server, and a subscriber (one client cache with
 * interest in every key of the region, or holding one continuous query of it). Each speaks a line protocol on stdin / stdout: it
 * prints {@code @@READY <json>} once serving, then answers commands with
 * {@code @@RESULT <json>}; it stops when stdin closes. Geode logs to a file, never stdout.
 */
final class Members {
  static final String REGION = "bench";
  /** NaN stays a bare NaN, which Python's json module reads as a float. */
  static final ObjectMapper JSON =
      JsonMapper.builder()
          .disable(JsonWriteFeature.WRITE_NAN_AS_STRINGS)
          .enable(JsonReadFeature.ALLOW_NON_NUMERIC_NUMBERS)
          .build();

  private Members() {}

  static Properties memberProperties(String logFile) {
    Properties properties = new Properties();
    properties.setProperty("log-level", "warning");
    properties.setProperty("log-file", logFile);
    properties.setProperty("statistic-sampling-enabled", "false");
    return properties;
  }

  /**
   * A server member's properties: on the loopback, no multicast, no JMX manager, HTTP
   * service or cluster configuration (each member is configured by its own code).
   */
  static Properties serverProperties(String logFile) {
    Properties properties = memberProperties(logFile);
    properties.setProperty("mcast-port", "0");
    properties.setProperty("bind-address", "127.0.0.1");
    properties.setProperty("jmx-manager", "false");
    properties.setProperty("http-service-port", "0");
    properties.setProperty("enable-cluster-configuration", "false");
    properties.setProperty("use-cluster-configuration", "false");
    return properties;
  }

  static void say(String tag, Object payload) throws Exception {
    System.out.println("@@" + tag + " " + JSON.writeValueAsString(payload));
    System.out.flush();
  }

  /**
   * {@code server <port> <log-file> <locator-port> <start-locator: true|false>
   * <member-timeout-ms>}
   */
  static void server(String[] args) throws Exception {
    int port = Integer.parseInt(args[1]);
    Properties properties = serverProperties(args[2]);
    int locatorPort = Integer.parseInt(args[3]);
    // Two servers: losing one is more than half the weight, which would make the survivor
    // shut itself down as the losing side of a partition; the failover phase wants it to
    // carry on, as an operator of a two-server system configures it.
    properties.setProperty("enable-network-partition-detection", "false");
    properties.setProperty("member-timeout", args[5]);
    if (locatorPort > 0) {
      properties.setProperty("locators", "127.0.0.1[" + locatorPort + "]");
      if (Boolean.parseBoolean(args[4])) {
        properties.setProperty("start-locator", "127.0.0.1[" + locatorPort + "]");
      }
    } else {
      properties.setProperty("locators", "");
    }
    Cache cache = new CacheFactory(properties).create();
    cache.<String, byte[]>createRegionFactory(RegionShortcut.REPLICATE).create(REGION);
    cache.<String, Object>createRegionFactory(RegionShortcut.REPLICATE).create(Reads.QUERY_REGION);
    CacheServer server = cache.addCacheServer();
    server.setBindAddress("127.0.0.1");
    server.setPort(port);
    server.start();
    say("READY", Map.of("port", port, "pid", ProcessHandle.current().pid()));
    waitForStdinClosed(null);
    cache.close();
  }

  /** A listener that records every create and update in arrivals. */
  static CacheListenerAdapter<String, byte[]> recording(Arrivals arrivals) {
    return new CacheListenerAdapter<String, byte[]>() {
      @Override
      public void afterCreate(EntryEvent<String, byte[]> event) {
        arrivals.hit(event.getKey(), event.getNewValue());
      }

      @Override
      public void afterUpdate(EntryEvent<String, byte[]> event) {
        arrivals.hit(event.getKey(), event.getNewValue());
      }
    };
  }

  /**
   * {@code subscriber <servers host:port,...> <redundancy> <log-file> [<cq query>]}: with a
   * query, the client holds it as a running CQ instead of registering interest, and its
   * listener counts the CQ's events.
   */
  static void subscriber(String[] args) throws Exception {
    Properties properties = memberProperties(args[3]);
    int redundancy = Integer.parseInt(args[2]);
    ClientCacheFactory factory =
        new ClientCacheFactory(properties)
            .setPoolSubscriptionEnabled(true)
            .setPoolSubscriptionRedundancy(redundancy);
    for (String server : args[1].split(",")) {
      String[] hostPort = server.split(":");
      factory.addPoolServer(hostPort[0], Integer.parseInt(hostPort[1]));
    }
    ClientCache cache = factory.create();
    Arrivals arrivals = new Arrivals();
    Region<String, byte[]> region =
        cache
            .<String, byte[]>createClientRegionFactory(ClientRegionShortcut.CACHING_PROXY)
            .addCacheListener(recording(arrivals))
            .create(REGION);
    if (args.length > 4 && !args[4].isEmpty()) {
      CqAttributesFactory attributes = new CqAttributesFactory();
      attributes.addCqListener(
          new CqListener() {
            @Override
            public void onEvent(CqEvent event) {
              arrivals.hit((String) event.getKey(), (byte[]) event.getNewValue());
            }

            @Override
            public void onError(CqEvent event) {}

            @Override
            public void close() {}
          });
      CqQuery cq = cache.getQueryService().newCq("bench", args[4], attributes.create());
      cq.execute();
    } else {
      region.registerInterestForAllKeys(InterestResultPolicy.NONE);
    }
    PoolImpl pool = (PoolImpl) PoolManager.getAll().values().iterator().next();
    long deadline = System.nanoTime() + 60_000_000_000L;
    while (pool.getRedundantNames().size() < Math.min(redundancy, args[1].split(",").length - 1)
        && System.nanoTime() < deadline) {
      Thread.sleep(50);
    }
    say(
        "READY",
        Map.of(
            "primary_port", pool.getPrimaryPort(),
            "redundant", pool.getRedundantNames().size(),
            "pid", ProcessHandle.current().pid()));
    waitForStdinClosed(arrivals);
    cache.close();
  }

  /**
   * Commands: {@code EXPECT <n> <count-from-ns> <idle-timeout-ms>} waits until n events came
   * (or none for the idle timeout) and answers the tally with latencies of values sent at or
   * after count-from-ns; {@code TRACK <n> <kill-ns> <idle-timeout-ms>} waits until n distinct
   * keys came and answers the failover figures around kill-ns.
   */
  static void waitForStdinClosed(Arrivals arrivals) throws Exception {
    BufferedReader in =
        new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    String line;
    while ((line = in.readLine()) != null) {
      String[] words = line.trim().split("\\s+");
      if (arrivals == null || words.length < 4) {
        continue;
      }
      long expected = Long.parseLong(words[1]);
      long fromNs = Long.parseLong(words[2]);
      long idleMs = Long.parseLong(words[3]);
      if (words[0].equals("EXPECT")) {
        arrivals.await(() -> arrivals.count(), expected, idleMs);
        say("RESULT", arrivals.tally(fromNs));
      } else if (words[0].equals("TRACK")) {
        arrivals.await(() -> arrivals.distinct(), expected, idleMs);
        say("RESULT", arrivals.failover(expected, fromNs));
      }
    }
  }

  static Map<String, Object> ordered(Object... keysAndValues) {
    Map<String, Object> map = new LinkedHashMap<>();
    for (int i = 0; i < keysAndValues.length; i += 2) {
      map.put((String) keysAndValues[i], keysAndValues[i + 1]);
    }
    return map;
  }

  static List<Long> list(long[] values, int length) {
    List<Long> out = new ArrayList<>(length);
    for (int i = 0; i < length; i++) {
      out.add(values[i]);
    }
    return out;
  }
}
