"""The plain records every layer speaks."""

from __future__ import annotations

from mlxcel.items import (
    IMAGE_PLACEHOLDER,
    FunctionCallOutput,
    InputImage,
    InputText,
    Message,
    OutputText,
    Refusal,
    RequestEcho,
    has_images,
    parts_text,
)


def test_echo_defaults_are_not_shared_between_instances() -> None:
    first, second = RequestEcho(model="m"), RequestEcho(model="m")
    assert first.text == second.text == {"format": {"type": "text"}}
    assert first.text is not second.text


def test_images_read_as_a_placeholder_on_their_own_line() -> None:
    image = InputImage(image_url="data:image/png;base64,AAAA")
    assert parts_text([InputText("Look:"), image, InputText("What is it?")]) == (
        f"Look:\n{IMAGE_PLACEHOLDER}\nWhat is it?"
    )
    assert parts_text([image, image]) == f"{IMAGE_PLACEHOLDER}\n{IMAGE_PLACEHOLDER}"
    assert parts_text([OutputText("a"), Refusal("b"), InputText("c")]) == "abc"
    assert Message("user", (InputText("x\n"), image)).text == f"x\n{IMAGE_PLACEHOLDER}"


def test_images_are_found_in_messages_and_call_outputs() -> None:
    image = InputImage(file_id="file_1")
    assert not has_images([Message("user", (InputText("x"),)), FunctionCallOutput("c", "y")])
    assert has_images([Message("user", (image,))])
    assert has_images([FunctionCallOutput("c", IMAGE_PLACEHOLDER, parts=(image,))])
