package io.regionbus.wire;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import org.apache.avro.generic.GenericRecord;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;

/**
 * Prints {ns}.events from its start to the end it had when this began, one JSON line per
 * event: a record in Avro's single-object encoding (the servers' events_framing
 * avro-single-object) is read by Avro's standard decoder, a regionbus frame by {@link
 * Frames#decode}.
 */
final class EventsReader {
  private EventsReader() {}

  static int read(String bootstrap, String topic, long timeoutMs) {
    try (KafkaConsumer<byte[], byte[]> consumer =
        new KafkaConsumer<>(WireClient.readerConfig(bootstrap, null))) {
      List<TopicPartition> partitions = new ArrayList<>();
      for (PartitionInfo info : consumer.partitionsFor(topic)) {
        partitions.add(new TopicPartition(topic, info.partition()));
      }
      consumer.assign(partitions);
      consumer.seekToBeginning(partitions);
      Map<TopicPartition, Long> ends = consumer.endOffsets(partitions);
      long deadline = System.nanoTime() + timeoutMs * 1_000_000L;
      while (!reachedEnds(consumer, ends) && System.nanoTime() < deadline) {
        for (ConsumerRecord<byte[], byte[]> record : consumer.poll(Duration.ofMillis(200))) {
          boolean singleObject = Frames.isSingleObject(record.value());
          GenericRecord event =
              singleObject
                  ? Frames.decodeSingleObject("Event", record.value())
                  : Frames.decode(record.value());
          System.out.println(
              Json.event(event)
                  .put("type", "event")
                  .put("framing", singleObject ? "avro-single-object" : "regionbus")
                  .put("partition", record.partition())
                  .put("offset", record.offset()));
        }
      }
      return reachedEnds(consumer, ends) ? 0 : 2;
    }
  }

  private static boolean reachedEnds(
      KafkaConsumer<byte[], byte[]> consumer, Map<TopicPartition, Long> ends) {
    for (Map.Entry<TopicPartition, Long> end : ends.entrySet()) {
      if (consumer.position(end.getKey()) < end.getValue()) {
        return false;
      }
    }
    return true;
  }
}
