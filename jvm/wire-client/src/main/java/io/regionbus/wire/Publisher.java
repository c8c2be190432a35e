package io.regionbus.wire;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.security.SecureRandom;
import java.time.Duration;
import java.util.Arrays;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.generic.GenericRecordBuilder;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Publishes entry changes to {ns}.ops as docs/wire-format.md says ("Publishing an operation,
 * step by step"): each operation in the partition of its bucket (never Kafka's default
 * partitioner), with an EventID of this run's member id, and waits for the servers' replies
 * in the client's partition of the shared reply topic, printing one JSON line per reply.
 */
final class Publisher {
  /** One change to send: PUT (with a JSON value) or DESTROY. */
  record Change(String kind, String key, String jsonValue) {}

  private final String bootstrap;
  private final String namespace;
  private final String clientId;
  private final String member;
  private final long thread;
  private long sequence;
  private final String kafkaPrincipal;
  private final boolean singleObject;
  private long requestId = new SecureRandom().nextLong(1L << 40) << 16;

  Publisher(
      String bootstrap,
      String namespace,
      String clientId,
      String member,
      long thread,
      long firstSequence,
      String kafkaPrincipal,
      boolean singleObject) {
    this.bootstrap = bootstrap;
    this.namespace = namespace;
    this.clientId = clientId;
    // A fresh member id per run: a run that reused the last run's member id and sequence 0
    // would have every change dropped by the servers as a duplicate.
    this.member = member != null ? member : clientId + "." + randomHex();
    this.thread = thread;
    this.sequence = firstSequence;
    this.kafkaPrincipal = kafkaPrincipal;
    this.singleObject = singleObject;
  }

  private static String randomHex() {
    byte[] bytes = new byte[3];
    new SecureRandom().nextBytes(bytes);
    return HexFormat.of().formatHex(bytes);
  }

  /**
   * Send the changes in order, then wait up to {@code replyTimeoutMs} for their replies.
   *
   * @return 0 when every change was answered ok, 1 when one was refused, 2 when a reply did
   *     not come in time
   */
  int publish(String region, List<Change> changes, long replyTimeoutMs) throws Exception {
    String opsTopic = namespace + ".ops";
    String replyTopic = namespace + ".replies" + (kafkaPrincipal == null ? "" : "." + kafkaPrincipal);
    try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(producerConfig());
        KafkaConsumer<byte[], byte[]> replies = new KafkaConsumer<>(consumerConfig())) {
      int totalBuckets = producer.partitionsFor(opsTopic).size();
      int replyPartitions = replies.partitionsFor(replyTopic).size();
      TopicPartition replyPartition =
          new TopicPartition(replyTopic, Frames.clientPartition(clientId, replyPartitions));
      replies.assign(List.of(replyPartition));
      replies.seekToEnd(List.of(replyPartition));
      replies.position(replyPartition); // fixed now: replies to what is sent next come after it
      Map<Long, Change> pending = new HashMap<>();
      for (Change change : changes) {
        int bucket = Frames.bucketOf(region, change.key(), totalBuckets);
        long id = ++requestId;
        GenericRecord op = operation(id, region, change, bucket);
        byte[] frame =
            singleObject ? Frames.encodeSingleObject(op) : Frames.encode(Frames.OPERATION, op);
        producer
            .send(
                new ProducerRecord<>(
                    opsTopic, bucket, change.key().getBytes(StandardCharsets.UTF_8), frame))
            .get();
        pending.put(id, change);
      }
      return awaitReplies(replies, pending, replyTimeoutMs);
    }
  }

  private GenericRecord operation(long id, String region, Change change, int bucket) {
    Schema schema = Frames.schema("Operation");
    GenericRecord eventId =
        new GenericRecordBuilder(Frames.schema("EventID"))
            .set("member", member)
            .set("thread", thread)
            .set("sequence", sequence++)
            .set("bucket", bucket)
            .build();
    GenericRecordBuilder op =
        new GenericRecordBuilder(schema)
            .set("request_id", id)
            .set("client_id", clientId)
            .set("event_id", eventId)
            .set("kind", new GenericData.EnumSymbol(schema.getField("kind").schema(), change.kind()))
            .set("region", region)
            .set("key", change.key())
            .set("timestamp_ms", System.currentTimeMillis())
            .set("kafka_principal", kafkaPrincipal);
    if (change.jsonValue() != null) {
      op.set("value", ByteBuffer.wrap(change.jsonValue().getBytes(StandardCharsets.UTF_8)));
      op.set("serializer", "json");
    }
    return op.build();
  }

  private int awaitReplies(
      KafkaConsumer<byte[], byte[]> replies, Map<Long, Change> pending, long timeoutMs) {
    byte[] ownKey = clientId.getBytes(StandardCharsets.UTF_8);
    long deadline = System.nanoTime() + timeoutMs * 1_000_000L;
    int status = 0;
    while (!pending.isEmpty() && System.nanoTime() < deadline) {
      for (ConsumerRecord<byte[], byte[]> record : replies.poll(Duration.ofMillis(200))) {
        if (!Arrays.equals(record.key(), ownKey)) {
          continue; // another client's reply, in the partition it shares
        }
        for (byte[] frame : Frames.split(record.value())) {
          if (Frames.typeOf(frame) != Frames.REPLY) {
            continue;
          }
          GenericRecord reply = Frames.decode(frame);
          Change change = pending.remove((Long) reply.get("request_id"));
          if (change == null) {
            continue; // an earlier run's, or a chunk already counted
          }
          boolean ok = (Boolean) reply.get("ok");
          status = ok ? status : 1;
          System.out.println(
              new Json()
                  .put("type", "reply")
                  .put("operation", change.kind())
                  .put("key", change.key())
                  .put("member", member)
                  .put("ok", ok)
                  .put("event_kind", Json.text(reply.get("event_kind")))
                  .put("duplicate", reply.get("duplicate"))
                  .put("version", reply.get("version"))
                  .put("error_type", Json.text(reply.get("error_type")))
                  .put("error_message", Json.text(reply.get("error_message"))));
        }
      }
    }
    for (Change change : pending.values()) {
      System.out.println(
          new Json().put("type", "no_reply").put("operation", change.kind()).put("key", change.key()));
    }
    return pending.isEmpty() ? status : 2;
  }

  private Properties producerConfig() {
    Properties config = new Properties();
    config.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    config.put(ProducerConfig.ACKS_CONFIG, "all");
    config.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, true);
    config.put(ProducerConfig.CLIENT_ID_CONFIG, member);
    config.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
    config.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
    return config;
  }

  private Properties consumerConfig() {
    return WireClient.readerConfig(bootstrap, null);
  }
}
