Feature: Upgrading the tables a database keeps for pico
  A SQLite file or PostgreSQL database holds pico's tables, and a newer pico may need them
  changed. Opening never changes them behind the operator's back: a database left by an
  older pico is refused with the command that upgrades it, until the operator upgrades it
  or the embedding service opts in to upgrades on open; a database changed by a newer pico
  is refused too. A new database is simply created. (issue 13, "Schema migrations a DBA
  can review")

  @sql
  Scenario: A database from pico's first release is refused until the operator upgrades it
    Given a database left by pico's first release with the messages "m1, m2"
    When the session is opened
    Then it is rejected as SchemaOutdatedError
    And the refusal names the database's revision, the revision needed and "pico db upgrade"
    And the database is unchanged
    When the operator upgrades the database
    Then the database is at the newest revision
    And the session opens and reads "m1, m2"

  @sql
  Scenario: The embedding service opts in to upgrades on open
    Given a database left by pico's first release with the messages "m1"
    When the session is opened with schema upgrades allowed
    Then the database is at the newest revision
    And the session opens and reads "m1"

  @sql
  Scenario: A DBA applies the reviewed SQL to a new database
    Given a new database
    When a DBA applies the SQL that "pico db sql" writes
    Then the database is at the newest revision
    And the session opens and reads "nothing"

  @sql
  Scenario: A database changed by a newer pico is refused, even with upgrades allowed
    Given a database changed by a newer pico
    When the session is opened with schema upgrades allowed
    Then it is rejected as ConfigurationError
    And the database is unchanged
