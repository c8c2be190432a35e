package io.regionbus.wire;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.avro.generic.GenericRecord;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;

/**
 * Reads one client's events from its partition of the shared queue topic, as
 * docs/wire-format.md says ("Reading a client's events from the shared queue topic"): the
 * partition is assigned, never read in the client's own group {ns}.client.<id> (its
 * committed offset is the client's ack); records keyed by the client's id, or keyed by a
 * NUL byte and listing the client in header rb.to, are its; batches are split, markers
 * skipped, the client's own changes in shared records left out, and duplicates dropped by
 * EventID. Prints one JSON line per event, then a summary line.
 */
final class QueueReader {
  static final String RECIPIENTS_HEADER = "rb.to";

  private final String clientId;
  private final byte[] ownKey;
  private final byte[] ownMarker;
  /** Highest sequence seen per (member, thread, bucket) of an EventID. */
  private final Map<String, Long> highest = new HashMap<>();
  private final Map<String, Long> highestCq = new HashMap<>();
  private long events;
  private long cqEvents;
  private long duplicates;
  private long markers;
  private long othersRecords;
  private long ownChanges;
  private long undecodable;

  QueueReader(String clientId) {
    this.clientId = clientId;
    this.ownKey = clientId.getBytes(StandardCharsets.UTF_8);
    byte[] marker = new byte[ownKey.length + 2];
    System.arraycopy(ownKey, 0, marker, 1, ownKey.length);
    this.ownMarker = marker; // NUL id NUL
  }

  /**
   * Read the client's partition from its start up to the end it had when this began, or
   * until {@code timeoutMs} passes.
   *
   * @return 0 when the end was reached, 2 on the timeout
   */
  int read(String bootstrap, String queueTopic, long timeoutMs) {
    try (KafkaConsumer<byte[], byte[]> consumer =
        new KafkaConsumer<>(WireClient.readerConfig(bootstrap, null))) {
      int partitions = consumer.partitionsFor(queueTopic).size();
      TopicPartition partition =
          new TopicPartition(queueTopic, Frames.clientPartition(clientId, partitions));
      consumer.assign(List.of(partition));
      consumer.seekToBeginning(List.of(partition));
      long end = consumer.endOffsets(List.of(partition)).get(partition);
      long deadline = System.nanoTime() + timeoutMs * 1_000_000L;
      while (consumer.position(partition) < end && System.nanoTime() < deadline) {
        for (ConsumerRecord<byte[], byte[]> record : consumer.poll(Duration.ofMillis(200))) {
          take(record);
        }
      }
      boolean done = consumer.position(partition) >= end;
      System.out.println(
          new Json()
              .put("type", "summary")
              .put("client_id", clientId)
              .put("partition", partition.partition())
              .put("end_offset", end)
              .put("reached_end", done)
              .put("events", events)
              .put("cq_events", cqEvents)
              .put("duplicates_dropped", duplicates)
              .put("markers_skipped", markers)
              .put("own_changes_skipped", ownChanges)
              .put("records_for_others", othersRecords)
              .put("undecodable", undecodable));
      return done ? 0 : 2;
    }
  }

  private void take(ConsumerRecord<byte[], byte[]> record) {
    byte[] key = record.key();
    boolean own = Arrays.equals(key, ownKey);
    if (!own && !listsMe(key, record)) {
      othersRecords++;
      return;
    }
    List<byte[]> frames;
    try {
      frames = Frames.split(record.value());
    } catch (IllegalArgumentException e) {
      undecodable++;
      return;
    }
    for (byte[] frame : frames) {
      int type = Frames.typeOf(frame);
      if (type == Frames.MARKER) {
        markers++; // a durable client's end of replay: no event
        continue;
      }
      if (type != Frames.EVENT && type != Frames.CQ_EVENT) {
        undecodable++; // nothing else belongs in a queue; a future type is skipped
        continue;
      }
      GenericRecord item;
      try {
        item = Frames.decode(frame);
      } catch (IllegalArgumentException e) {
        undecodable++;
        continue;
      }
      GenericRecord event = type == Frames.EVENT ? item : (GenericRecord) item.get("event");
      if (type == Frames.EVENT && !own && clientId.equals(Json.text(event.get("originator")))) {
        // A record for several clients is written once for all of them: the servers never
        // send a client its own change, so it leaves it out here.
        ownChanges++;
        continue;
      }
      if (!isNew(type == Frames.EVENT ? highest : highestCq, event)) {
        duplicates++;
        continue;
      }
      Json line = Json.event(event);
      if (type == Frames.EVENT) {
        events++;
        line.put("type", "event");
      } else {
        cqEvents++;
        line.put("type", "cq_event").put("cqs", item.get("cqs").toString());
      }
      System.out.println(
          line.put("offset", record.offset()).put("shared", !own));
    }
  }

  /** Whether a record keyed NUL + CRC hex lists this client in header rb.to. */
  private boolean listsMe(byte[] key, ConsumerRecord<byte[], byte[]> record) {
    if (key == null || key.length == 0 || key[0] != 0) {
      return false;
    }
    Header listed = record.headers().lastHeader(RECIPIENTS_HEADER);
    return listed != null && contains(listed.value(), ownMarker);
  }

  private static boolean contains(byte[] haystack, byte[] needle) {
    outer:
    for (int i = 0; i + needle.length <= haystack.length; i++) {
      for (int j = 0; j < needle.length; j++) {
        if (haystack[i + j] != needle[j]) {
          continue outer;
        }
      }
      return true;
    }
    return false;
  }

  /** Message tracking: new when its sequence is above the highest seen for its
   * (member, thread, bucket). */
  private static boolean isNew(Map<String, Long> seen, GenericRecord event) {
    GenericRecord id = (GenericRecord) event.get("event_id");
    String thread = id.get("member") + "\u0000" + id.get("thread") + "\u0000" + id.get("bucket");
    long sequence = (Long) id.get("sequence");
    Long before = seen.get(thread);
    if (before != null && sequence <= before) {
      return false;
    }
    seen.put(thread, sequence);
    return true;
  }
}
