package io.regionbus.wire;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.zip.CRC32;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.generic.GenericDatumWriter;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.BinaryDecoder;
import org.apache.avro.io.BinaryEncoder;
import org.apache.avro.io.DecoderFactory;
import org.apache.avro.io.EncoderFactory;
import org.apache.avro.message.BinaryMessageDecoder;
import org.apache.avro.message.BinaryMessageEncoder;

/**
 * The regionbus frame (docs/wire-format.md, "Frames and type bytes"): the magic byte 0xB1,
 * a type byte naming the record's schema, then the record in Avro's plain binary encoding.
 * The schemas are the repository's regionbus.*.avsc files, packaged with this program.
 */
public final class Frames {
  public static final int MAGIC = 0xB1;
  public static final int OPERATION = 1;
  public static final int EVENT = 2;
  public static final int REPLY = 3;
  public static final int CONTROL = 4;
  public static final int MARKER = 5;
  public static final int BATCH = 6;
  public static final int CQ_EVENT = 7;

  /** Named types first: a schema may refer only to names parsed before it. */
  private static final String[] SCHEMA_ORDER = {
    "EventID", "EventKind", "InterestSpec", "CqSpec", "QuerySpec", "FunctionSpec", "Entry",
    "Operation", "Event", "Reply", "Control", "Marker", "Batch", "CqEvent",
  };

  private static final Map<String, Schema> SCHEMAS = loadSchemas();
  private static final Map<Integer, Schema> BY_TYPE =
      Map.of(
          OPERATION, schema("Operation"),
          EVENT, schema("Event"),
          REPLY, schema("Reply"),
          CONTROL, schema("Control"),
          MARKER, schema("Marker"),
          CQ_EVENT, schema("CqEvent"));

  private Frames() {}

  private static Map<String, Schema> loadSchemas() {
    Schema.Parser parser = new Schema.Parser();
    Map<String, Schema> found = new HashMap<>();
    for (String name : SCHEMA_ORDER) {
      String resource = "/regionbus/schemas/regionbus." + name + ".avsc";
      try (InputStream in = Frames.class.getResourceAsStream(resource)) {
        if (in == null) {
          throw new IllegalStateException("schema " + resource + " is not packaged");
        }
        found.put(name, parser.parse(in));
      } catch (IOException e) {
        throw new UncheckedIOException(e);
      }
    }
    return found;
  }

  /** The schema of a record, by its name without namespace ("Operation", "EventID", ...). */
  public static Schema schema(String name) {
    Schema found = SCHEMAS.get(name);
    if (found == null) {
      throw new IllegalArgumentException("no schema " + name);
    }
    return found;
  }

  /** Frame a record: magic, type byte, Avro body. */
  public static byte[] encode(int typeByte, GenericRecord record) {
    ByteArrayOutputStream out = new ByteArrayOutputStream();
    out.write(MAGIC);
    out.write(typeByte);
    BinaryEncoder encoder = EncoderFactory.get().directBinaryEncoder(out, null);
    try {
      new GenericDatumWriter<GenericRecord>(record.getSchema()).write(record, encoder);
      encoder.flush();
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
    return out.toByteArray();
  }

  /**
   * A record in Apache Avro's single-object encoding (C3 01, the schema's CRC-64-AVRO
   * fingerprint, the body), written by Avro's own encoder: the servers read it as they
   * read the regionbus frame.
   */
  public static byte[] encodeSingleObject(GenericRecord record) {
    try {
      ByteBuffer encoded =
          new BinaryMessageEncoder<GenericRecord>(GenericData.get(), record.getSchema())
              .encode(record);
      byte[] bytes = new byte[encoded.remaining()];
      encoded.get(bytes);
      return bytes;
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  /** Whether a value starts as Avro's single-object encoding does (C3 01). */
  public static boolean isSingleObject(byte[] value) {
    return value != null && value.length >= 10 && (value[0] & 0xFF) == 0xC3 && value[1] == 1;
  }

  /**
   * Decode a single-object encoding of a record of {@code schemaName} with Avro's standard
   * decoder, which checks the fingerprint.
   *
   * @throws IllegalArgumentException the fingerprint is another schema's, or the body does
   *     not decode
   */
  public static GenericRecord decodeSingleObject(String schemaName, byte[] value) {
    try {
      return new BinaryMessageDecoder<GenericRecord>(GenericData.get(), schema(schemaName))
          .decode(value);
    } catch (IOException | RuntimeException e) {
      throw new IllegalArgumentException("not a single-object " + schemaName + ": " + e, e);
    }
  }

  /** The type byte of a frame, or -1 when it is no regionbus frame. */
  public static int typeOf(byte[] frame) {
    if (frame == null || frame.length < 2 || (frame[0] & 0xFF) != MAGIC) {
      return -1;
    }
    return frame[1] & 0xFF;
  }

  /**
   * Decode one frame (not a batch).
   *
   * @throws IllegalArgumentException not a frame, an unknown type byte, a body that does not
   *     decode, or bytes left after the body
   */
  public static GenericRecord decode(byte[] frame) {
    int type = typeOf(frame);
    Schema schema = BY_TYPE.get(type);
    if (schema == null) {
      throw new IllegalArgumentException("not a known regionbus frame (type " + type + ")");
    }
    return read(schema, frame);
  }

  private static GenericRecord read(Schema schema, byte[] frame) {
    BinaryDecoder decoder = DecoderFactory.get().binaryDecoder(frame, 2, frame.length - 2, null);
    try {
      GenericRecord record = new GenericDatumReader<GenericRecord>(schema).read(null, decoder);
      if (!decoder.isEnd()) {
        throw new IllegalArgumentException("trailing bytes after a " + schema.getName());
      }
      return record;
    } catch (IOException | RuntimeException e) {
      throw new IllegalArgumentException("undecodable " + schema.getName() + ": " + e, e);
    }
  }

  /**
   * The frames of a Kafka value: the items of a Batch (type 6), or the value itself.
   *
   * @throws IllegalArgumentException a batch whose body does not decode
   */
  public static List<byte[]> split(byte[] value) {
    List<byte[]> frames = new ArrayList<>();
    if (typeOf(value) != BATCH) {
      frames.add(value);
      return frames;
    }
    GenericRecord batch = read(schema("Batch"), value);
    for (Object item : (List<?>) batch.get("messages")) {
      ByteBuffer buffer = (ByteBuffer) item;
      byte[] frame = new byte[buffer.remaining()];
      buffer.get(frame);
      frames.add(frame);
    }
    return frames;
  }

  /** CRC-32 (zlib's) of bytes, unsigned. */
  public static long crc32(byte[] bytes) {
    CRC32 crc = new CRC32();
    crc.update(bytes);
    return crc.getValue();
  }

  /** The bucket (partition of {ns}.ops) of an entry: crc32(region NUL key) % totalBuckets. */
  public static int bucketOf(String region, String key, int totalBuckets) {
    byte[] bytes = (region + "\u0000" + key).getBytes(StandardCharsets.UTF_8);
    return (int) (crc32(bytes) % totalBuckets);
  }

  /** A client's partition of a shared queue or reply topic: crc32(client id) % partitions. */
  public static int clientPartition(String clientId, int partitions) {
    return (int) (crc32(clientId.getBytes(StandardCharsets.UTF_8)) % partitions);
  }
}
