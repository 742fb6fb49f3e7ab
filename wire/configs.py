"""The numbers the config APIs (DescribeConfigs, AlterConfigs, IncrementalAlterConfigs) put
on the wire, as Apache Kafka defines them (ConfigResource.Type, DescribeConfigsResponse's
ConfigSource and ConfigType, AlterConfigOp.OpType)."""

from __future__ import annotations

import enum


class ResourceType(enum.IntEnum):
    UNKNOWN = 0
    TOPIC = 2
    BROKER = 4
    BROKER_LOGGER = 8
    CLIENT_METRICS = 16
    GROUP = 32

    @classmethod
    def known(cls, value: int) -> bool:
        """Whether Kafka knows the type at all (it refuses a whole DescribeConfigs request
        naming one it does not)."""
        return value in cls._value2member_map_ and value != cls.UNKNOWN


class ConfigSource(enum.IntEnum):
    UNKNOWN = 0
    TOPIC_CONFIG = 1  # the admin clients' DYNAMIC_TOPIC_CONFIG
    DYNAMIC_BROKER_CONFIG = 2
    DYNAMIC_DEFAULT_BROKER_CONFIG = 3
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5
    DYNAMIC_BROKER_LOGGER_CONFIG = 6
    CLIENT_METRICS_CONFIG = 7
    GROUP_CONFIG = 8


class ConfigType(enum.IntEnum):
    UNKNOWN = 0
    BOOLEAN = 1
    STRING = 2
    INT = 3
    SHORT = 4
    LONG = 5
    DOUBLE = 6
    LIST = 7
    CLASS = 8
    PASSWORD = 9


class AlterConfigOp(enum.IntEnum):
    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3
