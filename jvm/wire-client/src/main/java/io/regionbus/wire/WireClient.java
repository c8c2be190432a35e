package io.regionbus.wire;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * A regionbus client with kafka-clients and Avro alone (docs/wire-format.md).
 *
 * <pre>
 * publish --bootstrap HOST:PORT --namespace NS --client-id ID --region R
 *         [--member M] [--thread 1] [--first-sequence 0] [--kafka-principal P]
 *         [--reply-timeout-ms 30000] [--framing regionbus|avro-single-object]
 *         put KEY JSON | destroy KEY ...
 * read    --bootstrap HOST:PORT --namespace NS --client-id ID [--kafka-principal P]
 *         [--timeout-ms 60000]
 * events  --bootstrap HOST:PORT --namespace NS [--timeout-ms 60000]
 * </pre>
 *
 * {@code events} prints {ns}.events from its start to its end, decoding records in Avro's
 * single-object encoding with Avro's standard decoder (the servers' events_framing).
 *
 * Output: one JSON object per line on standard output. Exit status: 0 done, 1 a change
 * was refused, 2 a reply or the queue's end did not come in time, 64 bad arguments.
 */
public final class WireClient {
  private WireClient() {}

  public static void main(String[] args) throws Exception {
    if (args.length == 0) {
      usage("a command is needed: publish or read");
    }
    Map<String, String> options = new HashMap<>();
    List<String> rest = new ArrayList<>();
    for (int i = 1; i < args.length; i++) {
      if (args[i].startsWith("--")) {
        if (i + 1 >= args.length) {
          usage(args[i] + " needs a value");
        }
        options.put(args[i].substring(2), args[++i]);
      } else {
        rest.add(args[i]);
      }
    }
    String bootstrap = required(options, "bootstrap");
    String namespace = required(options, "namespace");
    String principal = options.get("kafka-principal");
    int status;
    switch (args[0]) {
      case "publish" -> {
        Publisher publisher =
            new Publisher(
                bootstrap,
                namespace,
                required(options, "client-id"),
                options.get("member"),
                Long.parseLong(options.getOrDefault("thread", "1")),
                Long.parseLong(options.getOrDefault("first-sequence", "0")),
                principal,
                framing(options));
        status =
            publisher.publish(
                required(options, "region"),
                changes(rest),
                Long.parseLong(options.getOrDefault("reply-timeout-ms", "30000")));
      }
      case "read" -> {
        String topic = namespace + ".queues" + (principal == null ? "" : "." + principal);
        status =
            new QueueReader(required(options, "client-id"))
                .read(bootstrap, topic, Long.parseLong(options.getOrDefault("timeout-ms", "60000")));
      }
      case "events" ->
          status =
              EventsReader.read(
                  bootstrap,
                  namespace + ".events",
                  Long.parseLong(options.getOrDefault("timeout-ms", "60000")));
      default -> {
        usage("unknown command " + args[0]);
        return;
      }
    }
    System.out.flush();
    System.exit(status);
  }

  private static List<Publisher.Change> changes(List<String> words) {
    List<Publisher.Change> changes = new ArrayList<>();
    for (int i = 0; i < words.size(); ) {
      String kind = words.get(i).toUpperCase();
      if (kind.equals("PUT") && i + 2 < words.size()) {
        changes.add(new Publisher.Change("PUT", words.get(i + 1), words.get(i + 2)));
        i += 3;
      } else if (kind.equals("DESTROY") && i + 1 < words.size()) {
        changes.add(new Publisher.Change("DESTROY", words.get(i + 1), null));
        i += 2;
      } else {
        usage("changes are 'put KEY JSON' or 'destroy KEY', not " + words.subList(i, words.size()));
      }
    }
    if (changes.isEmpty()) {
      usage("publish needs at least one change");
    }
    return changes;
  }

  private static boolean framing(Map<String, String> options) {
    String framing = options.getOrDefault("framing", "regionbus");
    if (!framing.equals("regionbus") && !framing.equals("avro-single-object")) {
      usage("--framing is regionbus or avro-single-object, not " + framing);
    }
    return framing.equals("avro-single-object");
  }

  private static String required(Map<String, String> options, String name) {
    String value = options.get(name);
    if (value == null) {
      usage("--" + name + " is needed");
    }
    return value;
  }

  private static void usage(String problem) {
    System.err.println("wire-client: " + problem);
    System.exit(64);
  }

  /**
   * A consumer that reads assigned partitions and commits nothing: no group unless one is
   * named, and never a client's own group {ns}.client.<id>, whose offset is that client's
   * ack.
   */
  static Properties readerConfig(String bootstrap, String group) {
    Properties config = new Properties();
    config.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    if (group != null) {
      config.put(ConsumerConfig.GROUP_ID_CONFIG, group);
    }
    config.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
    config.put(ConsumerConfig.ALLOW_AUTO_CREATE_TOPICS_CONFIG, false);
    config.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
    config.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
    config.put(
        ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
    return config;
  }
}
